"""The printed benchmark report (vLLM's `bench serve` layout) and the side-by-side comparison.

Formatting only: these functions return strings and never print. The validation table is
`validation_report.py`'s (`format_validation`, importable from here too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvlab.cli.validation_report import format_validation as format_validation
from kvlab.metrics import LATENCY_KEY, PERCENTILE_METRICS
from kvlab.metrics.precision_mix import mix_rows

WIDTH = 50  # vLLM's report width
LABEL_WIDTH = 40
VALUE_WIDTH = 10
MAX_HEADER_WIDTH = 14  # longer comparison labels become [1], [2]... with a legend

# metric -> (short name, section header), as vLLM prints them
METRIC_NAMES = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}
THROUGHPUT_ROWS = (
    ("completed", "Successful requests:"),
    ("failed", "Failed requests:"),
    ("max_concurrency", "Maximum request concurrency:"),
    ("duration", "Benchmark duration (s):"),
    ("total_input_tokens", "Total input tokens:"),
    ("total_output_tokens", "Total generated tokens:"),
    ("request_throughput", "Request throughput (req/s):"),
    ("request_goodput", "Request goodput (req/s):"),
    ("output_throughput", "Output token throughput (tok/s):"),
    ("max_output_tokens_per_s", "Peak output token throughput (tok/s):"),
    ("max_concurrent_requests", "Peak concurrent requests:"),
    ("total_token_throughput", "Total Token throughput (tok/s):"),
)
KV_CACHE_ROWS = (
    ("kv_cache_size_tokens", "KV cache size (tokens):"),
    ("page_size", "Page size (tokens):"),
    ("kv_cache_dtype", "KV cache dtype:"),
    ("mean_kv_usage_perc", "Mean KV cache usage (%):"),
    ("peak_kv_usage_perc", "Peak KV cache usage (%):"),
    ("kv_token_state_perc", "KV slots holding token states (%):"),
    ("internal_fragmentation_perc", "Internal fragmentation (%):"),
    ("external_fragmentation_perc", "External fragmentation (%):"),
    ("prefix_cache_hit_rate_perc", "Prefix cache hit rate (%):"),
    ("num_preemptions", "Preemptions:"),
    ("num_swaps_out", "Swap-outs (requests):"),
    ("num_swap_out_pages", "Swapped-out pages:"),
    ("num_swaps_in", "Swap-ins (requests):"),
    ("num_swap_in_pages", "Swapped-in pages:"),
)
# A benchmark's server, from its own histograms (kvlab bench serve)
SERVER_ROWS = (
    ("server_mean_ttft_ms", "Server's mean TTFT (ms):"),
    ("server_mean_queue_time_ms", "Server's mean queue time (ms):"),
    ("server_mean_prefill_time_ms", "Server's mean prefill time (ms):"),
)
RUN_ROWS = (
    ("policy", "Policy:"),
    ("scheduling_policy", "Scheduling policy:"),
    ("backend", "Backend:"),
    ("model", "Model:"),
    ("hardware", "Hardware:"),
    ("host_cpu_steal_perc", "Client host CPU steal (%):"),  # withheld by the hypervisor
    ("cost_model", "Cost model:"),
    ("dataset", "Dataset:"),
    ("seed", "Seed:"),
    ("num_instances", "Instances:"),  # a cluster's (kvlab sim --num-instances N)
    ("router", "Router:"),
    ("pd", "Prefill:decode instances:"),  # disaggregated (kvlab sim --pd P:D)
    ("pd_handoffs", "Requests handed to decode:"),
    ("pd_transferred_pages", "KV pages sent to decode:"),
    ("pd_link_busy_s", "Prefill links busy (s):"),
)
# A cluster's per-instance table: summary key -> column header
INSTANCE_TABLE = (
    ("instance", "instance"),
    ("role", "role"),
    ("num_prompts", "requests"),
    ("request_throughput", "req/s"),
    ("output_throughput", "out tok/s"),
    ("mean_ttft_ms", "mean TTFT ms"),
    ("prefix_cache_hit_rate_perc", "prefix hit %"),
    ("peak_kv_usage_perc", "peak KV %"),
    ("num_preemptions", "preemptions"),
)


def _value(value: object) -> str:
    """A value as vLLM prints it: floats with 2 decimals, everything else as is."""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _row(label: str, value: object) -> str:
    return f"{label:<{LABEL_WIDTH}} {_value(value):<{VALUE_WIDTH}}"


def _header(text: str, fill: str, width: int = WIDTH) -> str:
    return f"{text:{fill}^{width}}"


def _latency_rows(summary: dict, metric: str) -> list[tuple[str, str]]:
    """(key, label) of a metric's mean, median and percentiles, in the summary's key order."""
    name = METRIC_NAMES[metric][0]
    rows = []
    for key in summary:
        match = LATENCY_KEY.match(key)
        if match is None or match.group(2) != metric or match.group(1) == "std":
            continue
        stat = match.group(1)
        word = stat.capitalize() if stat in ("mean", "median") else stat.upper()
        rows.append((key, f"{word} {name} (ms):"))
    return rows


def _request_rate_row(summary: dict) -> list[str]:
    """vLLM prints the configured rate only when it is finite; a ramp-up, its range."""
    rate = summary.get("request_rate")
    if summary.get("ramp_up_strategy"):
        start, end = summary["ramp_up_start_rps"], summary["ramp_up_end_rps"]
        return [_row("Ramp-up strategy:", summary["ramp_up_strategy"]),
                _row("Ramp-up RPS:", f"{start:g} to {end:g}")]
    if isinstance(rate, (int, float)) and math.isfinite(rate):
        return [f"{'Request rate configured (RPS):':<{LABEL_WIDTH}} {rate:<{VALUE_WIDTH}.2f}"]
    return []


TIER_ROWS = (
    ("pages", "pages:"),
    ("hit_rate_perc", "hit rate (%):"),
    ("hit_pages", "hit pages:"),
    ("stored_pages", "stored pages:"),
    ("evicted_pages", "evicted pages:"),
    ("demoted_pages", "pages moved down:"),
    ("link_busy_s", "link busy (s):"),
)


def _tier_rows(summary: dict) -> list[tuple[str, str]]:
    """(key, label) of the memory tiers' rows, tier by tier (none without tiers)."""
    tiers = summary.get("kv_tiers")
    if not isinstance(tiers, dict) or not tiers.get("tiers"):
        return []
    rows = [("device_prefix_hit_rate_perc", "Device prefix hit rate (%):")]
    for spec in str(tiers["tiers"]).split(","):
        kind = spec.split(":")[0]
        name = {"ssd": "SSD"}.get(kind, kind.capitalize())
        rows += [(f"{kind}_tier_{key}", f"{name} tier {label}")
                 for key, label in TIER_ROWS]
    return rows


def _group_rows(summary: dict) -> list[tuple[str, str]]:
    """(key, label) of a hybrid model's pages per KV-cache group (none for one group)."""
    groups = summary.get("kv_cache_groups")
    if not isinstance(groups, list):
        return []
    rows = [("prefix_cache_retention_interval", "Prefix-cache retention interval:")]
    for index, label in enumerate(groups):
        rows += [(f"kv_group_{index}_peak_pages", f"Group {index} {label} peak pages:"),
                 (f"kv_group_{index}_mean_pages", f"Group {index} {label} mean pages:")]
    return rows


def _precision_rows(summary: dict) -> list[tuple[str, str]]:
    """(key, label) of a precision policy's mix (`mix_rows`; none without)."""
    return [(key, f"{label}:") for label, key in mix_rows(summary)]


# per SLO class (kvlab.metrics.classes): (key in the class's dict, label after its name)
CLASS_ROWS = (
    ("completed", "completed:"),
    ("goodput_perc", "within SLO (%):"),
    ("request_goodput", "goodput (req/s):"),
    ("mean_ttft_ms", "mean TTFT (ms):"),
    ("p99_ttft_ms", "P99 TTFT (ms):"),
    ("mean_tpot_ms", "mean TPOT (ms):"),
    ("p99_e2el_ms", "P99 E2EL (ms):"),
    ("prefix_cache_hit_rate_perc", "prefix hit rate (%):"),
    ("num_preemptions", "preemptions:"),
)


def _class_lines(summary: dict) -> list[str]:
    """The SLO Classes section: each class's rows, Jain's index, the priority inversions
    (nothing for a run without classes)."""
    classes = summary.get("classes")
    if not isinstance(classes, dict) or not classes:
        return []
    lines = [_header("SLO Classes", "-")]
    for name, stats in classes.items():
        lines.extend(_row(f"{name} {label}", stats[key]) for key, label in CLASS_ROWS
                     if stats.get(key) is not None)
    if summary.get("fairness_jain") is not None:
        lines.append(_row("Jain's fairness (SLO attainment):", summary["fairness_jain"]))
    lines.append(_row("Priority inversions:", summary.get("num_priority_inversions")))
    return lines


def format_report(summary: dict, *, title: str = "Serving Benchmark Result") -> str:
    """The summary as vLLM's printed report, with a KV Cache and a Run section after it.

    Lines are vLLM's `{:<40} {:<10}` rows (floats with 2 decimals) under 50-wide centred headers;
    a row is printed only when its key is in the summary and not None.
    """
    lines = [_header(f" {title} ", "=")]
    for key, label in THROUGHPUT_ROWS:
        if summary.get(key) is not None:
            lines.append(_row(label, summary[key]))
        if key == "failed":
            lines.extend(f"  {count} {reason}" for reason, count
                         in (summary.get("failed_reasons") or {}).items())
        if key == "max_concurrency":
            lines.extend(_request_rate_row(summary))
    for metric in PERCENTILE_METRICS:
        rows = _latency_rows(summary, metric)
        if rows:
            lines.append(_header(METRIC_NAMES[metric][1], "-"))
            lines.extend(_row(label, summary[key]) for key, label in rows)
    for section, section_rows in (("KV Cache", KV_CACHE_ROWS), ("KV Tiers", _tier_rows(summary)),
                                  ("KV Cache Groups", _group_rows(summary)),
                                  ("KV Precision", _precision_rows(summary)),
                                  ("Server's Own Latency", SERVER_ROWS), ("Run", RUN_ROWS)):
        if section == "Run":
            lines.extend(_class_lines(summary))
        present = [(k, label) for k, label in section_rows if summary.get(k) is not None]
        if present:
            lines.append(_header(section, "-"))
            lines.extend(_row(label, summary[key]) for key, label in present)
    lines.append("=" * WIDTH)
    return "\n".join(_framed(lines))


def _framed(lines: list[str]) -> list[str]:
    """The lines with every header and rule (a WIDTH-wide line of `=` or `-` around its
    text) widened to the longest row, so that a long value (a policy spec, a dataset path)
    stays inside the frame."""
    width = max(len(line) for line in lines)
    if width <= LABEL_WIDTH + 1 + VALUE_WIDTH:  # vLLM's own rows, a column past its frame
        return lines
    framed = []
    for line in lines:
        fill = line[:1]
        if len(line) == WIDTH and fill in "=-" and line.endswith(fill):
            line = _header(line.strip(fill), fill, width)
        framed.append(line)
    return framed


def _comparison_rows(summaries: Sequence[dict]) -> list[tuple[str, str]]:
    """(key, label) of every numeric row present in at least one summary, in report order."""
    rows = list(THROUGHPUT_ROWS)
    for metric in PERCENTILE_METRICS:
        seen: dict[str, str] = {}
        for summary in summaries:
            seen.update(_latency_rows(summary, metric))
        rows.extend(seen.items())
    rows.extend(KV_CACHE_ROWS)
    for summary in summaries:
        rows.extend(row for row in _tier_rows(summary) if row not in rows)
    for summary in summaries:
        rows.extend(row for row in _group_rows(summary) if row not in rows)
    for summary in summaries:
        rows.extend(row for row in _precision_rows(summary) if row not in rows)
    rows.extend(_class_comparison_rows(summaries))
    return [(k, label) for k, label in rows
            if any(_lookup(s, k) is not None for s in summaries)]


def _class_comparison_rows(summaries: Sequence[dict]) -> list[tuple[str, str]]:
    """(key, label) of the SLO classes' rows (`classes.<name>.<stat>`), then fairness and
    inversions, for the classes any summary has."""
    names = sorted({name for s in summaries for name in (s.get("classes") or {})})
    if not names:
        return []
    rows = [(f"classes.{name}.{key}", f"{name} {label}") for name in names
            for key, label in CLASS_ROWS]
    return [*rows, ("fairness_jain", "Jain's fairness (SLO attainment):"),
            ("num_priority_inversions", "Priority inversions:")]


def _lookup(summary: dict, key: str) -> object:
    """A summary's value of a row key: a top-level key, or `classes.<name>.<stat>`."""
    if key.startswith("classes."):
        _, name, stat = key.split(".", 2)
        return ((summary.get("classes") or {}).get(name) or {}).get(stat)
    return summary.get(key)


def format_comparison(summaries: Sequence[dict], labels: Sequence[str]) -> str:
    """Several runs' summaries side by side: one metric per row, one column per run.

    Labels longer than MAX_HEADER_WIDTH (policy specs usually are) are shown as [1], [2]... in
    the header, with a legend of the full labels under the table.
    """
    if len(summaries) != len(labels) or not summaries:
        raise ValueError(f"{len(summaries)} summaries but {len(labels)} labels")
    abbreviate = any(len(label) > MAX_HEADER_WIDTH for label in labels)
    headers = [f"[{i}]" for i in range(1, len(labels) + 1)] if abbreviate else list(labels)
    rows = _comparison_rows(summaries)
    cells = [
        [_value(_lookup(s, key)) if _lookup(s, key) is not None else "-" for s in summaries]
        for key, _ in rows
    ]
    widths = [
        max(len(headers[i]), *(len(row[i]) for row in cells)) + 2 for i in range(len(headers))
    ]
    total = max(WIDTH, LABEL_WIDTH + sum(widths))

    def line(label: str, values: Sequence[str]) -> str:
        return f"{label:<{LABEL_WIDTH}}" + "".join(
            f"{v:>{w}}" for v, w in zip(values, widths, strict=True)
        )

    lines = [_header(" Policy Comparison ", "=", total), line("Metric", headers), "-" * total]
    lines.extend(line(label, row) for (_, label), row in zip(rows, cells, strict=True))
    lines.append("=" * total)
    if abbreviate:
        lines.extend(f"[{i}] {label}" for i, label in enumerate(labels, start=1))
    return "\n".join(lines)


def format_instances(summaries: Sequence[dict], *, title: str = "Per Instance") -> str:
    """A cluster's instance summaries as one table, one row per instance (requests completed,
    throughputs, mean TTFT, prefix hit rate, peak KV usage, preemptions, and a precision
    policy's page demotions per second)."""
    table = list(INSTANCE_TABLE)
    if any("precision_demotions_per_s" in summary for summary in summaries):
        table.append(("precision_demotions_per_s", "demotions/s"))  # (a precision policy's)
    rows = [{header: summary.get(key) for key, header in table} for summary in summaries]
    body = format_table(rows, [header for _, header in table], max_rows=len(rows))
    width = max(WIDTH, *(len(line) for line in body.splitlines()))
    return "\n".join([_header(f" {title} ", "=", width), body, "=" * width])


def format_table(rows: Sequence[dict], columns: Sequence[str], *, max_rows: int = 40) -> str:
    """Rows as an aligned text table of `columns` (a sweep's or a tuning's results): floats
    with 2 decimals, missing values '-'; past `max_rows`, a line says how many are left out."""
    def cell(value: object) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return _value(value)

    shown = list(rows[:max_rows])
    cells = [[cell(row.get(column)) for column in columns] for row in shown]
    widths = [max(len(column), *(len(line[i]) for line in cells)) if cells else len(column)
              for i, column in enumerate(columns)]
    lines = ["  ".join(f"{column:>{width}}" for column, width in zip(columns, widths,
                                                                      strict=True))]
    lines.append("  ".join("-" * width for width in widths))
    lines.extend("  ".join(f"{value:>{width}}" for value, width in zip(line, widths, strict=True))
                 for line in cells)
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more rows")
    return "\n".join(lines)
