"""The arrival process of a cluster: SimPy events at the trace's arrival times, where the
router hands requests to instances and wakes the idle ones; and `delay_until`, the delay that
lands a SimPy clock exactly on a time.

Admission itself is the shared rule of `kvlab.policies.ArrivalQueue`, applied by the instance at
the start of each step; this process only makes sure an instance with nothing to do resumes at
exactly the next arrival time (one event per distinct arrival time, none per step). An instance
alone needs no such process: it sleeps to its own next arrival.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterable
from typing import Any

import simpy


def arrival_process(
    env: simpy.Environment, arrival_times_s: Iterable[float], wake: Callable[[], None]
) -> Generator[simpy.Event, Any, None]:
    """SimPy process body: at each distinct arrival time, in order, call `wake`."""
    last = -math.inf
    for arrival_s in arrival_times_s:
        if arrival_s <= last:
            continue
        last = arrival_s
        yield env.timeout(delay_until(env.now, arrival_s))
        wake()


def delay_until(now_s: float, target_s: float) -> float:
    """A delay d with now_s + d == target_s exactly in floating point where one exists, else
    the smallest with now_s + d > target_s.

    SimPy computes an event's time as now + delay; target - now can round so that the sum misses
    the target by an ulp, and an instance woken an ulp before an arrival would not admit it.
    """
    if target_s <= now_s:
        return 0.0
    delay = target_s - now_s
    for _ in range(8):
        reached = now_s + delay
        if reached == target_s:
            return delay
        delay = math.nextafter(delay, math.inf if reached < target_s else -math.inf)
    # Some targets no sum reaches (the delay's ulp steps the sum over it): the first delay
    # that reaches past it wakes the instance an ulp late, which still admits the arrival.
    delay = target_s - now_s
    while now_s + delay < target_s:
        delay = math.nextafter(delay, math.inf)
    return delay
