"""Thinning a long per-step series for a figure: equal-width bins of its x values."""

from __future__ import annotations

import numpy as np


def bin_starts(x: np.ndarray, points: int) -> np.ndarray:
    """The index of the first value in each of `points` equal-width bins of `x` (sorted) that
    holds any; every index where `x` has no more than `points` values."""
    if len(x) <= points:
        return np.arange(len(x))
    edges = np.linspace(x[0], x[-1], points + 1)
    bins = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, points - 1)
    return np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
