"""The engine's two clocks: wall time (live, real-time replay) and a virtual clock that advances
by measured step durations (as-fast-as-possible replay), both following the time rule of
docs/architecture.md."""

from __future__ import annotations

import time

REPLAY_MODES = ("fast", "realtime")


class VirtualClock:
    """Starts at 0; a step ending adds its measured duration; idle time jumps to the next arrival.

    This is exactly the simulator's clock, with measured durations in place of the cost model's.
    """

    __slots__ = ("_now_s",)

    def __init__(self) -> None:
        self._now_s = 0.0

    def now(self) -> float:
        """The clock time, in seconds."""
        return self._now_s

    def end_step(self, start_s: float, measured_s: float) -> float:
        """The end time of a step that started at `start_s` and took `measured_s`."""
        self._now_s = start_s + measured_s
        return self._now_s

    def wait_until(self, time_s: float) -> None:
        """Jump to `time_s` (nothing to run before it)."""
        self._now_s = max(self._now_s, time_s)


class WallClock:
    """Seconds of real time since the clock was created; idle time is slept through."""

    __slots__ = ("_origin",)

    def __init__(self) -> None:
        self._origin = time.perf_counter()

    def now(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self._origin

    def end_step(self, start_s: float, measured_s: float) -> float:
        """Now: the wall clock already counted the step (and whatever surrounded it)."""
        return self.now()

    def wait_until(self, time_s: float) -> None:
        """Sleep until `time_s` (the next arrival)."""
        delay = time_s - self.now()
        if delay > 0:
            time.sleep(delay)


def make_clock(replay: str) -> VirtualClock | WallClock:
    """The clock of a replay mode: `fast` (virtual) or `realtime` (wall)."""
    from kvlab.errors import KvlabError

    if replay == "fast":
        return VirtualClock()
    if replay == "realtime":
        return WallClock()
    raise KvlabError(
        f"replay {replay!r}: expected one of {', '.join(REPLAY_MODES)}",
        parameters=("replay",),
    )
