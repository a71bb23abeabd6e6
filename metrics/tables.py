"""A run's two tables, per request and per step: as columns (what `save_results` writes, without
pandas) and as pandas DataFrames (for callers that analyse them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvlab.metrics.classes import request_classes
from kvlab.metrics.records import StepRecorder
from kvlab.metrics.run_result import RunResult
from kvlab.metrics.summary import request_arrays, step_columns

if TYPE_CHECKING:  # pandas is imported by the DataFrame functions only
    import pandas as pd


def request_columns(result: RunResult) -> dict[str, Any]:
    """One row per request: lengths, status, latencies in ms (NaN where undefined), counters;
    and each request's priority and SLO class when the run has classes. Column name ->
    numpy array (numbers) or list (text, None where empty)."""
    requests = result.requests
    arrays = request_arrays(requests)
    ms = 1000.0
    columns: dict[str, Any] = {
        "request_id": arrays.request_id,
        "arrival_s": arrays.arrival_s,
        "input_len": arrays.input_len,
        "output_len": arrays.output_len,
        "status": [r.status.value for r in requests],
        "error": [r.error for r in requests],
        "ttft_ms": arrays.ttft_s * ms,
        "tpot_ms": arrays.tpot_s * ms,
        "e2el_ms": arrays.e2el_s * ms,
        "num_cached_tokens": arrays.num_cached_tokens,
        "num_preemptions": arrays.num_preemptions,
        "num_swaps_out": arrays.num_swaps_out,
        "first_scheduled_s": arrays.first_scheduled_s,
        "finish_s": arrays.finish_s,
    }
    if request_classes(requests) is not None:
        columns["priority"] = np.array([getattr(r, "priority", 0) for r in requests],
                                       dtype=np.int64)
        columns["slo_class"] = [getattr(r, "slo_class", None) for r in requests]
    return columns


def frame_of(columns: dict[str, Any]) -> pd.DataFrame:
    """Columns as a DataFrame: lists (text) as object columns (None stays None), arrays of
    numbers as int64 or float64 columns."""
    import pandas as pd

    return pd.DataFrame({name: pd.Series(values, dtype=object) if isinstance(values, list)
                         else np.asarray(values) for name, values in columns.items()})


def per_request_table(result: RunResult) -> pd.DataFrame:
    """`request_columns` as a DataFrame."""
    return frame_of(request_columns(result))


def per_step_table(result: RunResult) -> pd.DataFrame:
    """One row per engine step: the StepRecorder's columns."""
    return step_table(result.steps)


def step_table(steps: StepRecorder) -> pd.DataFrame:
    """A recorder's steps as a table, in STEP_COLUMNS order."""
    import pandas as pd

    return pd.DataFrame(step_columns(steps))
