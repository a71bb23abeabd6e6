"""The figures of runs: memory and queues over time, latency CDFs, and for several runs a
side-by-side comparison of their summaries."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvlab.metrics.precision_mix import SPARED_PAGES, used_pages_in_bytes
from kvlab.plots.binning import bin_starts
from kvlab.plots.load import RunData
from kvlab.plots.model import Figure, Panel, Series
from kvlab.plots.precision import precision_panels

if TYPE_CHECKING:
    import pandas as pd

# Points kept per line: a long run has 10^5 steps; the largest value in each time bin is kept,
# so peaks (of KV usage, of the queue) survive.
MAX_POINTS = 1500
LATENCIES = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("e2el_ms", "E2E latency (ms)"))
SUMMARY_BARS = (
    ("output_throughput", "Output throughput (tok/s)"),
    ("mean_ttft_ms", "Mean TTFT (ms)"),
    ("p99_ttft_ms", "P99 TTFT (ms)"),
    ("mean_tpot_ms", "Mean TPOT (ms)"),
    ("peak_kv_usage_perc", "Peak KV cache usage (%)"),
    ("num_preemptions", "Preemptions"),
)


def binned_max(x: np.ndarray, y: np.ndarray, points: int = MAX_POINTS
               ) -> tuple[list[float], list[float]]:
    """At most `points` (x, y) pairs: x cut into equal bins, each bin's largest y at its first
    x. Shorter series come back whole."""
    if len(x) <= points:
        return x.tolist(), y.tolist()
    starts = bin_starts(x, points)
    return x[starts].tolist(), np.maximum.reduceat(y, starts).tolist()


def _total_pages(steps: pd.DataFrame, summary_total: object) -> np.ndarray | float | None:
    """Each step's device KV pages: used + cached free + free (an instance's own, in a
    cluster of unequal instances), else, or where a precision policy demoted pages, the
    summary's num_total_pages; None when unknown."""
    if "num_used_pages" not in steps:
        return None
    if SPARED_PAGES in steps:  # (a precision policy's pool holds more page ids: the device's)
        return float(summary_total) if summary_total else None  # type: ignore[arg-type]
    parts = ("num_used_pages", "num_cached_free_pages", "num_free_pages")
    if all(part in steps for part in parts):
        total = sum(steps[part].to_numpy(dtype=float) for part in parts)
        return np.where(total > 0, total, np.nan)
    return float(summary_total) if summary_total else None  # type: ignore[arg-type]


def _step_series(run: RunData) -> dict[str, list[tuple[str, np.ndarray, np.ndarray]]]:
    """KV usage (%), running and waiting over time, per instance of a cluster's steps."""
    steps = run.steps
    out: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {
        "kv": [], "running": [], "waiting": []}
    if steps is None or "start_s" not in steps or steps.empty:
        return out
    groups = (steps.groupby("instance", sort=True) if "instance" in steps
              else [(None, steps)])
    for instance, group in groups:
        name = run.label if instance is None else f"{run.label} / {instance}"
        group = group.sort_values("start_s")
        t = group["start_s"].to_numpy(dtype=float)
        pages = _total_pages(group, run.summary.get("num_total_pages"))
        if pages is not None:
            usage = used_pages_in_bytes(group).to_numpy(dtype=float) * 100.0 / pages
            out["kv"].append((name, t, usage))
        for key in ("running", "waiting"):
            if f"num_{key}" in group:
                out[key].append((name, t, group[f"num_{key}"].to_numpy(dtype=float)))
    return out


def timeline_figure(runs: list[RunData], name: str = "timeline") -> Figure | None:
    """KV cache usage, running and waiting requests against simulated time (the steps
    table), and for runs that demoted pages their precision mix and demotions per second
    (plots/precision.py); None when no run has one."""
    per_run = [_step_series(run) for run in runs]
    panels = []
    for key, title, unit in (("kv", "KV cache usage", "% of KV memory held"),
                             ("running", "Running requests", "requests"),
                             ("waiting", "Waiting requests", "requests")):
        series = tuple(Series(label, *binned_max(t, y))
                       for lines in per_run for label, t, y in lines[key])
        if series:
            panels.append(Panel(title, "time (s)", unit, "line", series))
    panels += precision_panels(runs, MAX_POINTS)
    if not panels:
        return None
    return Figure(name, "Memory and queues over time", tuple(panels), columns=1)


def cdf_points(values: np.ndarray, points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """An empirical CDF as (value, % of requests at or below it), at most `points` points
    (quantiles) for a long series."""
    values = np.sort(values[np.isfinite(values)])
    if len(values) > points:
        fractions = np.linspace(0.0, 1.0, points)
        return np.quantile(values, fractions).tolist(), (fractions * 100.0).tolist()
    share = np.arange(1, len(values) + 1) * 100.0 / len(values)
    return values.tolist(), share.tolist()


# Request statuses that served no tokens (their latencies are not latencies).
UNSERVED = ("finished_error", "finished_aborted")


def _finished(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests that were served: finished by length, stop or time, not failed."""
    if "status" in requests:
        return requests[~requests["status"].astype(str).isin(UNSERVED)]
    return requests


def latency_figure(runs: list[RunData], name: str = "latency") -> Figure | None:
    """CDFs of TTFT, TPOT and end-to-end latency over the finished requests of each run
    (the requests table); None when no run has one."""
    panels = []
    for column, title in LATENCIES:
        series = []
        for run in runs:
            if run.requests is None or column not in run.requests:
                continue
            values = _finished(run.requests)[column].to_numpy(dtype=float)
            if np.isfinite(values).any():
                series.append(Series(run.label, *cdf_points(values)))
        if series:
            panels.append(Panel(f"{title} CDF", title, "% of finished requests", "step",
                                tuple(series)))
    if not panels:
        return None
    return Figure(name, "Latency distributions", tuple(panels), columns=len(panels))


def summary_figure(runs: list[RunData], name: str = "summary") -> Figure | None:
    """The key summary metrics of each run side by side, one panel per metric."""
    labels = [run.label for run in runs]
    panels = []
    for key, title in SUMMARY_BARS:
        values = [run.summary.get(key) for run in runs]
        if all(value is None for value in values):
            continue
        y = [float("nan") if value is None else float(value) for value in values]
        panels.append(Panel(title, "", title, "bar", (Series(title, labels, y),)))
    if not panels:
        return None
    return Figure(name, "Runs compared", tuple(panels), columns=3)


def run_figures(runs: list[RunData]) -> list[Figure]:
    """One run: its timeline and latency CDFs. Several: the same, each run a line, plus the
    summaries side by side (`summary`)."""
    figures = [timeline_figure(runs), latency_figure(runs)]
    if len(runs) > 1:
        figures.append(summary_figure(runs))
    return [figure for figure in figures if figure is not None]
