"""Metrics per SLO class: latency percentiles and goodput of each class, Jain's fairness index
over the classes, and the number of priority inversions (BLIS reports the same three).

A request's class is its `slo_class`; a run whose requests carry none but differ in
`priority` is split by priority instead ("priority 0", "priority 1", ...). A run with neither
has no classes, and its summary no class keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvlab.metrics.exact import exact_sum

NO_CLASS = "(none)"


def request_classes(requests: Sequence[Any]) -> tuple[list[str], np.ndarray] | None:
    """Each request's class name and the array of priorities, or None when the run has no
    classes (no request has an `slo_class`, and all share one priority)."""
    priorities = np.array([getattr(r, "priority", 0) for r in requests], dtype=np.int64)
    names = [getattr(r, "slo_class", None) for r in requests]
    if any(name is not None for name in names):
        return [NO_CLASS if name is None else name for name in names], priorities
    if priorities.size and (priorities != priorities[0]).any():
        return [f"priority {p}" for p in priorities.tolist()], priorities
    return None


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one
    holds everything; None for no values, 1.0 when all are 0."""
    x = np.asarray(values, dtype=np.float64)
    if not x.size:
        return None
    squares = exact_sum(x * x)
    return 1.0 if squares == 0 else exact_sum(x) ** 2 / (x.size * squares)


def count_priority_inversions(arrival_s: np.ndarray, first_scheduled_s: np.ndarray,
                              priorities: np.ndarray) -> int:
    """Pairs (a, b) where b, of lower priority (a larger value), was first scheduled while a
    had arrived and was still waiting for its first schedule: arrival(a) <= scheduled(b) <
    scheduled(a). Requests never scheduled wait forever. Under fcfs these are the admissions
    that priority scheduling would reorder; under priority they happen only when the higher
    request did not fit."""
    scheduled = np.where(np.isnan(first_scheduled_s), np.inf, first_scheduled_s)
    ran = ~np.isnan(first_scheduled_s)
    total = 0
    for level in np.unique(priorities).tolist():
        higher = priorities < level
        if not higher.any():
            continue
        arrivals = np.sort(arrival_s[higher])
        starts = np.sort(scheduled[higher])
        lower_starts = scheduled[(priorities == level) & ran]
        # higher requests arrived by t, less those first scheduled by t (never before arrival)
        waiting = (np.searchsorted(arrivals, lower_starts, side="right")
                   - np.searchsorted(starts, lower_starts, side="right"))
        total += int(waiting.sum())
    return total
