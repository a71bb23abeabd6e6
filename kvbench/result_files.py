"""A bench run's files: the result JSON (vLLM's keys), the per-request and metrics tables, and
the KV event stream beside them, saved; and a saved result read back (`kvlab bench serve`'s
own, or `vllm bench serve`'s) for `calibrate --from-bench` and `validate --base-url`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.bench.kv_event_stream import save_stream, stream_path
from kvlab.bench.observed import ServerInfo
from kvlab.bench.records import BenchRequest
from kvlab.bench.result import DETAILED_KEYS, RESULT_FORMAT, BenchResult
from kvlab.bench.vllm_result import from_vllm_document, is_vllm_bench_result, missing_vllm_keys
from kvlab.errors import KvlabError
from kvlab.metrics import RunResult, StepRecorder, save_results
from kvlab.policies import RequestStatus


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


def load_bench_result(path: str | Path) -> BenchResult:
    """Read a result that `kvlab bench serve --save-result --save-detailed` wrote, or one of
    vLLM's own `vllm bench serve --save-result --save-detailed` (kvlab.bench.vllm_result: what
    it lacks); a KvlabError naming the file when it is neither, or lacks the per-request
    arrays."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvlabError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise KvlabError(f"{path}: not a JSON result file ({exc})") from None
    if is_vllm_bench_result(document):
        return _vllm_result(path, document)
    if not isinstance(document, dict) or document.get("format") != RESULT_FORMAT:
        raise KvlabError(f"{path}: neither a `kvlab bench serve` result (no format "
                         f"{RESULT_FORMAT!r}) nor a `vllm bench serve` one")
    missing = [key for key in (*DETAILED_KEYS, "kvlab_request_ids", "kvlab_statuses")
               if key not in document]
    if missing:
        raise KvlabError(f"{path}: lacks the per-request arrays ({missing[0]}, ...): save the "
                         "run with --save-result --save-detailed")
    try:
        return _from_document(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise KvlabError(f"{path}: malformed result ({type(exc).__name__}: {exc})") from None


def _vllm_result(path: Path, document: dict[str, Any]) -> BenchResult:
    """A `vllm bench serve` result (kvlab.bench.vllm_result), with its file named on error."""
    missing = missing_vllm_keys(document)
    if missing:
        raise KvlabError(f"{path}: a `vllm bench serve` result without the per-request arrays "
                         f"({missing[0]}, ...): run vllm bench serve with --save-result "
                         "--save-detailed")
    try:
        return BenchResult(**from_vllm_document(document))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise KvlabError(f"{path}: malformed vllm bench result ({type(exc).__name__}: "
                         f"{exc})") from None


def _from_document(d: dict[str, Any]) -> BenchResult:
    requests = []
    for i, request_id in enumerate(d["kvlab_request_ids"]):
        record = BenchRequest(int(request_id), int(d["input_lens"][i]),
                              int(d["kvlab_max_tokens"][i]), float(d["kvlab_scheduled_times"][i]))
        record.arrival_s = float(d["start_times"][i])
        record.status = RequestStatus(d["kvlab_statuses"][i])
        record.error = d["errors"][i] or None
        record.chunk_tokens = [int(n) for n in d["kvlab_chunk_tokens"][i]]
        if record.chunk_tokens:
            first = record.arrival_s + float(d["ttfts"][i])
            record.chunk_times_s = [first, *(first + np.cumsum(d["itls"][i])).tolist()]
        record.num_output_tokens = int(d["output_lens"][i]) or sum(record.chunk_tokens)
        record.num_cached_tokens = int(d["kvlab_num_cached_tokens"][i])
        record.finish_s = (record.arrival_s + float(d["latencies"][i]) if record.completed
                           else record.chunk_times_s[-1] if record.chunk_times_s
                           else record.arrival_s)
        record.generated_text = d["generated_texts"][i]
        if "kvlab_priorities" in d:
            record.priority = int(d["kvlab_priorities"][i])
            record.slo_class = d["kvlab_slo_classes"][i]
        requests.append(record)
    info = ServerInfo.from_json(d["server"])
    itls = [gap for r in requests if r.completed for gap in r.itls_s()]
    keys = ("policy", "model", "hardware", "dataset", "dataset_name", "dataset_source",
            "backend", "endpoint_type", "seed", "request_rate", "burstiness", "time_scale",
            "max_concurrency", "label", "base_url", "slo_classes", "request_id_prefix")
    run = RunResult(
        requests=requests,
        steps=StepRecorder(),
        itls_s=np.array(itls, dtype=np.float64),
        duration_s=float(d["duration"]),
        page_size=info.block_size or 0,
        num_total_pages=info.num_gpu_blocks or 0,
        kv_cache_size_tokens=(info.block_size or 0) * (info.num_gpu_blocks or 0),
        metadata={k: d[k] for k in keys if k in d},
    )
    series = {k: [float("nan") if v is None else float(v) for v in values]
              for k, values in (d.get("kvlab_metrics_series") or {}).items()}
    prompts = d.get("kvlab_prompt_token_ids")
    for record, ids in zip(requests, d.get("kvlab_output_token_ids") or (), strict=False):
        record.output_token_ids = ids
    host_cpu = {k: [float(v) for v in values]
                for k, values in (d.get("kvlab_host_cpu") or {}).items()}
    return BenchResult(run, info, series, float(d["started_at"]), list(d["metrics_errors"]),
                       d["kvlab_hash_ids"], int(d["kvlab_hash_block_size"]),
                       prompt_token_ids=prompts, host_cpu=host_cpu)
