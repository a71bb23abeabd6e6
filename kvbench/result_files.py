"""A bench run's files: the result JSON (vLLM's keys), the per-request and metrics tables, and
the KV event stream beside them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.bench.kv_event_stream import save_stream, stream_path
from kvlab.metrics import save_results

if TYPE_CHECKING:
    from kvlab.bench.serve import BenchResult


def save_bench_result(result: BenchResult, summary: dict, *, result_dir: str | Path,
                      result_filename: str | None, table_format: str = "csv",
                      append: bool = False, detailed: bool = False) -> list[Path]:
    """Save a bench result (kvlab.metrics.save_results: the JSON, the per-request and metrics
    tables) and its KV event stream beside it; the paths written, the JSON first."""
    paths = save_results(
        result.to_json(summary, detailed=detailed), result.run, result_dir=result_dir,
        result_filename=result_filename, table_format=table_format,
        tables={"requests": result.requests_table(), "metrics": result.metrics_table()},
        append=append,
    )
    if result.kv_events is not None:
        paths.append(save_stream(result.kv_events, stream_path(paths[0])))
    return paths
