"""Sums whose bits do not depend on the process that takes them."""

from __future__ import annotations

import math

import numpy as np


def exact_sum(values: np.ndarray) -> float:
    """The correctly rounded sum of `values`: the same bits in any process and on any machine.

    numpy's dot goes through BLAS, whose summation order follows its thread count (a Ray
    worker runs one thread, a local process several), so its last digit varies between
    processes; math.fsum's result depends on no order.
    """
    return math.fsum(np.asarray(values, dtype=np.float64).tolist())
