"""The figure of a validation report: each metric's relative error, and the simulator's
values beside the reference's (kvlab's engine, or a server)."""

from __future__ import annotations

from typing import Any

from kvlab.plots.load import ValidationData
from kvlab.plots.model import Figure, Panel, Series

# The groups of metrics drawn side by side (one unit to a panel).
GROUPS = (
    ("Latency (ms)", ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                      "p99_tpot_ms", "mean_e2el_ms", "p99_e2el_ms")),
    ("Throughput (tok/s)", ("output_throughput", "total_token_throughput")),
    ("Percent", ("prefix_cache_hit_rate_perc", "mean_kv_usage_perc", "peak_kv_usage_perc")),
)
# The metrics followed window by window (the ones `kvlab validate` prints per window).
WINDOW_METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")


def _number(value: object) -> float:
    return float("nan") if value is None else float(value)  # type: ignore[arg-type]


def _error_panel(metrics: dict[str, dict[str, Any]]) -> Panel | None:
    keys = [key for key, row in metrics.items() if row.get("rel_error") is not None]
    if not keys:
        return None
    errors = [100.0 * float(metrics[key]["rel_error"]) for key in keys]
    return Panel("Relative error (sim - reference) / reference", "%", "", "barh",
                 (Series("relative error (%)", keys, errors),))


def _value_panels(metrics: dict[str, dict[str, Any]], reference: str) -> list[Panel]:
    panels = []
    for title, group in GROUPS:
        keys = [key for key in group if key in metrics]
        if not keys:
            continue
        series = (Series("sim", keys, [_number(metrics[key]["sim"]) for key in keys]),
                  Series(reference, keys, [_number(metrics[key].get(reference))
                                           for key in keys]))
        panels.append(Panel(title, "", title, "bar", series))
    return panels


def _window_panel(windows: list[dict[str, Any]]) -> Panel | None:
    """Each window's relative error of each metric it reports, against the window's number."""
    by_metric: dict[str, list[float]] = {}
    for window in windows:
        for key, row in (window.get("metrics") or {}).items():
            if key in WINDOW_METRICS and isinstance(row, dict) and "rel_error" in row:
                by_metric.setdefault(key, []).append(100.0 * _number(row["rel_error"]))
    if not by_metric:
        return None
    series = tuple(Series(key, [str(i + 1) for i in range(len(values))], values)
                   for key, values in by_metric.items())
    return Panel("Relative error per window", "window", "%", "line", series)


def validation_figures(validation: ValidationData) -> list[Figure]:
    """`validation`: relative errors, the values of both sides, and per window when the
    report has windows."""
    document = validation.document
    metrics = document.get("metrics") or {}
    reference = str(document.get("reference") or "engine")
    panels = [_error_panel(metrics), *_value_panels(metrics, reference),
              _window_panel(document.get("windows") or [])]
    kept = tuple(panel for panel in panels if panel is not None)
    if not kept:
        return []
    title = f"Simulator vs {reference}: {validation.label}"
    return [Figure("validation", title, kept, columns=2)]
