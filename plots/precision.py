"""The precision mix over time, from a demoting run's step table (its `num_pages_at_level_K`
and `num_demotions_to_level_K` columns: policies/precision/mix.py): the share of held and
cached pages at each level, and pages demoted per second."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvlab.metrics.precision_mix import DEMOTIONS_TO_LEVEL, PAGES_AT_LEVEL, level_label
from kvlab.plots.binning import bin_starts
from kvlab.plots.model import Panel, Series

if TYPE_CHECKING:
    import pandas as pd

    from kvlab.plots.load import RunData

# Demotions come in bursts (a prompt's backlog at once): at most this many windows, so that a
# long run's rate reads as a rate, not as its bursts.
RATE_WINDOWS = 200


def level_columns(steps: pd.DataFrame, prefix: str) -> list[str]:
    """The step table's columns named `prefix` + level, by level."""
    return sorted((name for name in steps.columns if name.startswith(prefix)),
                  key=lambda name: int(name[len(prefix):]))


def level_names(summary: dict, num_levels: int) -> list[str]:
    """Each level's dtype (`level_label`), from the summary's `precision_levels` (else "level
    K")."""
    names = str(summary.get("precision_levels") or "").split("/")
    if len(names) != num_levels:
        return [f"level {k}" for k in range(num_levels)]
    return [level_label(name) for name in names]


def binned_shares(x: np.ndarray, parts: list[np.ndarray], points: int
                  ) -> tuple[list[float], list[list[float]]]:
    """Each of `parts`' share (%) of their sum, over at most `points` equal bins of `x`, at
    each bin's first x (a bin with nothing in it: NaN)."""
    starts = bin_starts(x, points)
    sums = [np.add.reduceat(part.astype(float), starts) for part in parts]
    total = sum(sums)
    total = np.where(total > 0, total, np.nan)
    return x[starts].tolist(), [(100.0 * part / total).tolist() for part in sums]


def binned_rate(x: np.ndarray, counts: np.ndarray, points: int
                ) -> tuple[list[float], list[float]]:
    """`counts` (each at its x) per unit of x, in windows of one unit (more where that would
    make over `points`), at each window's start."""
    span = float(x[-1] - x[0])
    num_bins = max(1, min(points, int(np.ceil(span))))
    edges = np.linspace(x[0], x[0] + (span or 1.0), num_bins + 1)  # (one step: one unit)
    cumulative = np.r_[0.0, np.cumsum(counts, dtype=float)]
    at_edges = cumulative[np.searchsorted(x, edges, side="left")]
    at_edges[-1] = cumulative[-1]  # (the last window takes the last step too)
    return edges[:-1].tolist(), (np.diff(at_edges) / np.diff(edges)).tolist()


def precision_panels(runs: list[RunData], points: int) -> list[Panel]:
    """The mix and the demotion rate over simulated time for the runs that demoted (none
    where no run's step table has the columns); lines named by level, and by run where
    several runs demoted."""
    demoting = [(run, run.steps) for run in runs if run.steps is not None
                and not run.steps.empty and "start_s" in run.steps
                and level_columns(run.steps, PAGES_AT_LEVEL)]
    shares: list[Series] = []
    rates: list[Series] = []
    for run, steps in demoting:
        label = run.label if len(demoting) > 1 else ""
        pages = level_columns(steps, PAGES_AT_LEVEL)
        if "instance" in steps:  # (a cluster's instances, in turn: one clock each)
            steps = steps.sort_values("start_s", kind="stable")
        t = steps["start_s"].to_numpy(dtype=float)
        names = level_names(run.summary, len(pages))
        x, ys = binned_shares(t, [steps[name].to_numpy() for name in pages], points)
        shares += [Series(f"{label} {name}".strip(), x, y)
                   for name, y in zip(names, ys, strict=True)]
        demoted = sum(steps[name].to_numpy(dtype=float)
                      for name in level_columns(steps, DEMOTIONS_TO_LEVEL))
        rates.append(Series(label or "pages demoted",
                            *binned_rate(t, np.asarray(demoted), min(points, RATE_WINDOWS))))
    if not shares:
        return []
    return [Panel("KV precision mix", "time (s)", "% of held and cached pages", "line",
                  tuple(shares)),
            Panel("Demotions", "time (s)", "pages demoted per s", "line", tuple(rates))]
