"""Nelder-Mead minimisation for the few parameters a simulator-in-the-loop fit tunes (scipy is
not a dependency: a simplex over 2-5 parameters needs a page of numpy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, frozen=True)
class Minimum:
    """Where the search ended: the point, its value and how many evaluations it took."""

    x: np.ndarray
    value: float
    num_evaluations: int


def nelder_mead(
    objective: Callable[[np.ndarray], float],
    x0: np.ndarray,
    *,
    step: float = 0.3,
    max_evaluations: int = 120,
    tolerance: float = 1e-4,
) -> Minimum:
    """Minimise `objective` from `x0` with the standard simplex moves (reflect 1, expand 2,
    contract 0.5, shrink 0.5); the first simplex steps `step` along each axis. Stops when the
    simplex's values differ by less than `tolerance`, or with the move that reaches
    `max_evaluations` (a move that begins one short of it and ends in a shrink passes it by
    the number of parameters + 1: reflect, contract, shrink)."""
    x0 = np.asarray(x0, dtype=np.float64)
    simplex = [x0] + [x0 + step * np.eye(x0.size)[i] for i in range(x0.size)]
    values = [objective(x) for x in simplex]
    evaluations = len(values)
    while evaluations < max_evaluations:
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < tolerance:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        value = objective(reflected)
        evaluations += 1
        if value < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            expanded_value = objective(expanded)
            evaluations += 1
            if expanded_value < value:
                reflected, value = expanded, expanded_value
            simplex[-1], values[-1] = reflected, value
        elif value < values[-2]:
            simplex[-1], values[-1] = reflected, value
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            contracted_value = objective(contracted)
            evaluations += 1
            if contracted_value < values[-1]:
                simplex[-1], values[-1] = contracted, contracted_value
            else:
                for i in range(1, len(simplex)):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = objective(simplex[i])
                evaluations += len(simplex) - 1
    best = int(np.argmin(values))
    return Minimum(simplex[best], float(values[best]), evaluations)
