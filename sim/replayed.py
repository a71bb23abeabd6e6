"""A cost model that replays an engine's measured step durations (lockstep validation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ReplayedStepTimes:
    """A cost model that charges each simulated step the duration the engine measured for the
    step of the same index (memory work included, so swaps and copies cost nothing extra).

    Past the engine's last step it charges 0 and counts the extra steps: lockstep reports
    them as a divergence instead of stopping the simulation.
    """

    def __init__(self, durations_s: Sequence[float], preemption_costs: Any = None) -> None:
        self._durations_s = list(durations_s)
        self._next = 0
        self._costs = preemption_costs

    def step_time_s(self, shape: object) -> float:
        """The engine's measured duration of the next step."""
        index = self._next
        self._next += 1
        if index < len(self._durations_s):
            return self._durations_s[index]
        return 0.0

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        """0 on the link (the measured duration holds it); under preemption=auto the manager
        is given the engine's measured costs instead of this model."""
        return 0.0

    def copy_time_s(self, num_pages: int) -> float:
        """0 (inside the measured duration)."""
        return 0.0

    def demoted_read_time_s(self, num_saved_tokens: float) -> float:
        """0 (inside the measured duration)."""
        return 0.0

    def requantize_time_s(self, num_pages: float) -> float:
        """0 (inside the measured duration)."""
        return 0.0

    def recompute_time_s(self, num_tokens: int) -> float:
        """Only asked under preemption=auto, which gets the engine's costs; linear otherwise."""
        return float(num_tokens)
