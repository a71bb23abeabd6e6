"""kvlab.metrics: the record both worlds produce (`RunResult`, per-step and per-request
tables), its summaries in vLLM's bench keys plus KV-cache metrics, and its result files.

Layer 1: imports only `kvlab.errors`, numpy and pandas (never torch, never the policies).
"""

from kvlab.metrics.records import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    STEP_COLUMNS,
    StepCounts,
    StepRecorder,
)
from kvlab.metrics.results import (
    TABLE_FORMATS,
    default_result_filename,
    save_results,
    save_step_profile,
)
from kvlab.metrics.run_result import COMPLETED_STATUSES, RequestRecord, RunResult, merge_runs
from kvlab.metrics.summary import (
    METADATA_KEYS,
    count_good_requests,
    step_columns,
    summarize,
)
from kvlab.metrics.summary_options import (
    GOODPUT_METRICS,
    LATENCY_KEY,
    PERCENTILE_METRICS,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    percentile_label,
)
from kvlab.metrics.tables import per_request_table, per_step_table, request_columns, step_table

__all__ = [
    "COMPLETED_STATUSES",
    "FLOAT_COLUMNS",
    "GOODPUT_METRICS",
    "INT_COLUMNS",
    "LATENCY_KEY",
    "METADATA_KEYS",
    "PERCENTILE_METRICS",
    "STEP_COLUMNS",
    "TABLE_FORMATS",
    "RequestRecord",
    "RunResult",
    "StepCounts",
    "StepRecorder",
    "count_good_requests",
    "default_result_filename",
    "merge_runs",
    "parse_goodput",
    "parse_metric_percentiles",
    "parse_percentile_metrics",
    "per_request_table",
    "per_step_table",
    "percentile_label",
    "request_columns",
    "save_results",
    "save_step_profile",
    "step_columns",
    "step_table",
    "summarize",
]
