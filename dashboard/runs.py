"""Simulated runs as the pages show them (`RunView`), sweeps over a grid, validate results."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.dashboard.workload import Setup, check_upload
from kvlab.errors import KvlabError
from kvlab.metrics import per_request_table, per_step_table, summarize
from kvlab.policies import PolicySpec
from kvlab.sim import simulate
from kvlab.sweep import (
    PARAM_PREFIX,
    TIMING_COLUMNS,
    SerialExecutor,
    SweepSpec,
    SweepStore,
    run_points,
    split_values,
)
from kvlab.sweep.settings import SETTINGS
from kvlab.traces import Trace, guess_dataset_name
from kvlab.traces.bundled import bundled_dataset_name

PERCENTILES = (50, 90, 99)
HEADLINE = (
    ("request_throughput", "requests/s", "{:.2f}"),
    ("output_throughput", "output tok/s", "{:,.0f}"),
    ("mean_ttft_ms", "mean TTFT (ms)", "{:,.1f}"),
    ("p99_ttft_ms", "P99 TTFT (ms)", "{:,.1f}"),
    ("mean_tpot_ms", "mean TPOT (ms)", "{:,.1f}"),
    ("num_preemptions", "preemptions", "{:,}"),
    ("mean_kv_usage_perc", "mean KV usage", "{:.1f}%"),
    ("kv_token_state_perc", "KV holding tokens", "{:.1f}%"),
)
# The serving config's fields a simulated setup carries into a sweep's settings
SERVING_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                    "enable_chunked_prefill", "scheduler_reserve_full_isl",
                    "gpu_memory_utilization", "num_gpu_blocks_override", "kv_cache_memory_bytes",
                    "swap_space_bytes")
# The settings the Sweep page can vary (eviction, preemption, victim, block_sizing and precision
# take policy names, kv_tiers tier specs with `+` between the tiers of one value); each value is
# read as `kvlab sweep` reads it, by the settings table (kvlab.sweep.settings)
SWEEP_PARAMETERS = ("block_size", "watermark", "eviction", "preemption", "victim", "block_sizing",
                    "precision", "request_rate", "time_scale", "max_num_seqs",
                    "max_num_batched_tokens", "tensor_parallel_size", "gpu_memory_utilization",
                    "kv_tiers", "kv_tier_block_size")


@dataclass(slots=True)
class RunView:
    """One simulated run as tables: the summary, one row per engine step, one per request."""

    summary: dict[str, Any]
    steps: pd.DataFrame
    requests: pd.DataFrame


def run_view(trace: Trace, setup: Setup, policy: PolicySpec | str,
             goodput_slos: dict[str, float] | None = None) -> RunView:
    """Simulate `trace` on the setup's machine under `policy` and tabulate the result."""
    result = simulate(trace, setup.config(policy))
    summary = summarize(result, percentile_metrics=("ttft", "tpot", "itl", "e2el"),
                        metric_percentiles=PERCENTILES, goodput_slos=goodput_slos or None)
    return RunView(summary, per_step_table(result), per_request_table(result))


def summary_table(views: Sequence[RunView], labels: Sequence[str]) -> pd.DataFrame:
    """One row per run: its label, then every scalar summary key, and each SLO class's
    metrics as `classes.<name>.<stat>` columns."""
    rows = []
    for label, view in zip(labels, views, strict=True):
        scalars = {k: v for k, v in view.summary.items() if not isinstance(v, (dict, list))}
        classes = {f"classes.{name}.{stat}": value
                   for name, stats in (view.summary.get("classes") or {}).items()
                   for stat, value in stats.items()}
        rows.append({"label": label, **scalars, **classes})
    return pd.DataFrame(rows)


def best_run(table: pd.DataFrame, metric: str = "request_goodput") -> str | None:
    """The label of the run with the highest `metric` (ties: the first); None with no goodput."""
    if metric not in table or not (table[metric] > 0).any():
        return None
    return str(table.loc[table[metric].idxmax(), "label"])


def parse_values(name: str, text: str) -> list[Any]:
    """The comma-separated values of sweep parameter `name`, e.g. '8, 16, 32' for block_size."""
    if name not in SWEEP_PARAMETERS:
        raise KvlabError(f"cannot sweep {name!r}; choose from {', '.join(SWEEP_PARAMETERS)}")
    read = SETTINGS[name].convert
    values = []
    for item in split_values(name, text):  # (a precision value keeps its commas)
        try:
            values.append(read(item))
        except ValueError as error:
            raise KvlabError(f"{name} values: {item!r}: {error}") from None
    if not values:
        raise KvlabError(f"{name} values: give at least one, comma-separated, e.g. 8,16,32")
    return values


def sweep(setup: Setup, policy: PolicySpec, x: str, x_values: Sequence[Any], y: str | None,
          y_values: Sequence[Any], *, goodput_slos: dict[str, float] | None = None,
          on_point: Callable[[int, int], object] | None = None) -> pd.DataFrame:
    """Simulate every point of the grid x_values (x y_values) in this process, through
    `kvlab sweep`'s library, and return one row each: x, y, the summary's numbers, `error`.

    Points are in grid order, x varying fastest; `on_point(done, total)` is called after each
    (progress bars). A bad value raises before any run; a run that fails is a row with its
    error.
    """
    grid = {y: list(y_values), x: list(x_values)} if y else {x: list(x_values)}
    if "block_size" in grid:  # the swept page size replaces the base policy's
        policy = policy.with_options(block_size=PolicySpec().block_size)
    with setup_settings(setup, policy, goodput_slos) as base:
        if "request_rate" in grid:
            base.pop("time_scale", None)
        if "time_scale" in grid:
            base.pop("request_rate", None)
        points = SweepSpec.create(base, grid).points()
        rows: list[dict[str, Any]] = [{} for _ in points]
        for done, (index, row) in enumerate(run_points(points, SerialExecutor()), start=1):
            rows[index] = row
            if on_point is not None:
                on_point(done, len(points))
    table = []
    for row in rows:
        line = {x: row[PARAM_PREFIX + x], **({y: row[PARAM_PREFIX + y]} if y else {})}
        line.update({k: v for k, v in row.items() if k not in TIMING_COLUMNS and k not in line
                     and not k.startswith(PARAM_PREFIX) and isinstance(v, (int, float))})
        line["error"] = row["error"]
        table.append(line)
    return pd.DataFrame(table)


@contextmanager
def setup_settings(setup: Setup, policy: PolicySpec,
                   goodput_slos: dict[str, float] | None = None) -> Iterator[dict[str, Any]]:
    """The sweep settings of a setup running `policy` (an uploaded trace is a temporary file
    while the context lasts)."""
    serving = setup.serving
    settings: dict[str, Any] = {
        "num_prompts": setup.num_prompts, "seed": setup.seed, "model": setup.model,
        "hardware": setup.hardware, "tensor_parallel_size": setup.tensor_parallel_size,
        "policy": policy.to_string(),
        **{name: getattr(serving, name) for name in SERVING_SETTINGS},
    }
    if setup.request_rate is not None:
        settings["request_rate"] = setup.request_rate
    else:
        settings["time_scale"] = setup.time_scale
    if goodput_slos:
        settings["goodput"] = goodput_slos
    if setup.upload is None:
        settings.update(dataset_name=bundled_dataset_name(setup.trace), dataset_path=setup.trace)
        yield settings
        return
    check_upload(setup.trace, setup.upload)
    with tempfile.TemporaryDirectory(prefix="kvlab-upload-") as folder:
        path = Path(folder) / Path(setup.trace).name
        path.write_bytes(setup.upload)
        dataset = guess_dataset_name(path) if setup.dataset_name == "auto" else setup.dataset_name
        settings.update(dataset_name=dataset, dataset_path=str(path))
        yield settings


def load_sweep_folder(path: str) -> tuple[pd.DataFrame, list[str]]:
    """A `kvlab sweep` Parquet dataset and the parameters it varies: each `param.NAME` column
    is renamed NAME (replacing the summary's column of that name), and the axes are the
    parameters with more than one value, in column order."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise KvlabError(f"{folder}: no such folder; give the --output folder of a kvlab sweep")
    frame = SweepStore(folder).read()
    params = [c for c in frame.columns if c.startswith(PARAM_PREFIX)]
    if frame.empty or not params:
        raise KvlabError(f"{folder}: no sweep rows (part-*.parquet files of kvlab sweep)")
    names = {c: c[len(PARAM_PREFIX):] for c in params}
    frame = frame.drop(columns=[n for n in names.values() if n in frame.columns])
    frame = frame.rename(columns=names)
    axes = [name for name in names.values()
            if frame[name].astype(str).nunique(dropna=False) > 1]
    return frame, axes


def numeric_metrics(table: pd.DataFrame, exclude: Sequence[str] = ()) -> list[str]:
    """Columns of a summary table that hold numbers and are not parameters."""
    return [c for c in table.columns
            if c not in exclude and pd.api.types.is_numeric_dtype(table[c])
            and not pd.api.types.is_bool_dtype(table[c])]


def load_validate_result(name: str, data: bytes) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The metrics table (metric, sim, engine, rel_error) and the other top-level fields of a
    `kvlab validate` result JSON; a KvlabError names what is missing or malformed."""
    try:
        result = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KvlabError(f"{name} is not a JSON file: {err}") from None
    if not isinstance(result, dict) or not isinstance(result.get("metrics"), dict):
        raise KvlabError(f"{name}: expected a kvlab validate result, a JSON object with "
                         '"metrics": {NAME: {"sim": x, "engine": y, "rel_error": e}}')
    rows = []
    # a server's validation (validate --base-url) names its measured side "server"; the
    # table's column stays "engine", the measured side, and metrics the server does not
    # report are left out
    reference = str(result.get("reference", "engine"))
    for metric, entry in result["metrics"].items():
        if not isinstance(entry, dict):
            raise KvlabError(f"{name}: metrics.{metric} is {entry!r}; expected an object with "
                             f"sim, {reference} and rel_error")
        if reference != "engine" and entry.get(reference) is None:
            continue
        row: dict[str, Any] = {"metric": metric}
        for field in ("sim", "engine", "rel_error"):
            value = entry.get(reference if field == "engine" else field)
            if field == "rel_error" and value is None:  # undefined: the engine's value is 0
                value = math.nan
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise KvlabError(f"{name}: metrics.{metric}.{field} is {value!r}; "
                                 "expected a number")
            row[field] = float(value)
        rows.append(row)
    if not rows:
        raise KvlabError(f"{name}: \"metrics\" is empty; nothing to compare")
    info = {k: v for k, v in result.items() if k != "metrics"}
    return pd.DataFrame(rows), info


def summaries_side_by_side(info: dict[str, Any]) -> pd.DataFrame | None:
    """The engine's and the simulator's summaries of a validate result, key by key (numbers
    only); None when the result carries no summaries."""
    engine, sim = info.get(str(info.get("reference", "engine"))), info.get("sim")
    if not isinstance(engine, dict) or not isinstance(sim, dict):
        return None
    keys = [k for k, v in engine.items() if isinstance(v, (int, float))
            and not isinstance(v, bool) and isinstance(sim.get(k), (int, float))]
    return pd.DataFrame({"metric": keys, "engine": [engine[k] for k in keys],
                         "sim": [sim[k] for k in keys]})
