"""A server's API latency as the simulator charges it: a request reaches the scheduler
`api_latency_s` after its client sent it, plus `api_latency_per_request_s` for every request
in flight (sent and not finished) when it was sent, and never before a request sent earlier
(first come, first served).

Why the load term: a server's API streams every running request's tokens on its own event
loop, so a new request waits longer when many run. Measured on vLLM 0.32 on CPU (client TTFT
less the server's own, per 0.25 s scrape): about 2.5 ms with a few requests in flight, 6.5-7
ms with 35-45 (docs/validation.md). A constant fitted on busy windows put light ones' TTFT 25%
high.

The load at a send depends on when earlier requests finish, which the run decides, so the
simulator iterates (`run_with_api_load`): a run with the constant alone, then runs whose
delays come from the previous run's in-flight counts, until those counts repeat (or
`MAX_LOAD_PASSES` runs more). Every run is deterministic, so the result is too.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from kvlab.policies import Request

MAX_LOAD_PASSES = 4  # runs after the first, at most, when the latency has a load term
Result = TypeVar("Result")


class Sent(Protocol):
    """A request as a client saw it: when it was sent and when it finished (a simulated
    `Request`, or a benchmark's `BenchRequest`)."""

    @property
    def request_id(self) -> int: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def finish_s(self) -> float | None: ...


def api_latency_terms(cost_model: object) -> tuple[float, float]:
    """(seconds per request, seconds more per request in flight at its send) of a cost
    model; (0, 0) for one that models no server API (a roofline, an engine's profile)."""
    return (float(getattr(cost_model, "api_latency_s", 0.0)),
            float(getattr(cost_model, "api_latency_per_request_s", 0.0)))


def in_flight_at_send(requests: Sequence[Sent]) -> dict[int, int]:
    """Request id -> how many other requests were sent before it and had not finished when
    it was sent (the client's view; `arrival_s` is the send; one never finished counts as
    in flight to the end)."""
    sends = sorted(r.arrival_s for r in requests)
    ends = sorted(r.finish_s for r in requests if r.finish_s is not None)
    # Those sent before a send, less those of them finished by it: every request finished by
    # then was sent before it, but for one sent and ended at that very time (failed at once).
    instant = Counter(r.arrival_s for r in requests if r.finish_s == r.arrival_s)
    return {r.request_id: bisect_left(sends, r.arrival_s)
            - (bisect_right(ends, r.arrival_s) - instant[r.arrival_s]) for r in requests}


def api_delays(requests: Sequence[Request], cost_model: object,
               in_flight: dict[int, int] | None) -> list[float]:
    """Each request's delay from its send to the scheduler, in `requests`' order
    (`in_flight` None: the constant alone)."""
    base, per_request = api_latency_terms(cost_model)
    if not per_request or in_flight is None:
        return [base] * len(requests)
    return [base + per_request * in_flight.get(r.request_id, 0) for r in requests]


def delay_arrivals(requests: Sequence[Request], delays_s: Sequence[float]) -> list[float]:
    """Move each request's arrival to when the scheduler sees it (`scheduler_arrivals`).
    Returns the sends, for `restore_sends` after the run."""
    assert len(delays_s) == len(requests), "a delay for each request"
    sends = [request.arrival_s for request in requests]
    for request, arrival in zip(requests, scheduler_arrivals(sends, delays_s), strict=True):
        request.arrival_s = arrival
    return sends


def scheduler_arrivals(sends_s: Sequence[float], delays_s: Sequence[float]) -> list[float]:
    """When the scheduler sees each request: its send plus its delay, in the order they were
    sent: an API hands requests on first come, first served, so none reaches the scheduler
    before one sent earlier (whose delay, under more load, was longer)."""
    arrivals = [0.0] * len(sends_s)
    latest = -math.inf
    for index in sorted(range(len(sends_s)), key=sends_s.__getitem__):  # stable: ties in order
        latest = max(latest, sends_s[index] + delays_s[index])
        arrivals[index] = latest
    return arrivals


def restore_sends(requests: Sequence[Request], sends_s: Sequence[float]) -> None:
    """Put back the arrivals `delay_arrivals` moved: latencies count from the client's send."""
    for request, sent in zip(requests, sends_s, strict=True):
        request.arrival_s = sent


def run_with_api_load(run_once: Callable[[dict[int, int] | None, str], Result],
                      requests_of: Callable[[Result], Sequence[Request]],
                      cost_model: object) -> Result:
    """`run_once(None, label)`, then, where the cost model's API latency has a load term, runs
    with the in-flight counts of the run before until two runs see the same counts (at most
    `MAX_LOAD_PASSES` more). The label names the run for its progress bar (a rerun says
    which). Returns the last run's result."""
    result = run_once(None, "simulating")
    if not api_latency_terms(cost_model)[1]:
        return result
    seen = in_flight_at_send(requests_of(result))
    for rerun in range(1, MAX_LOAD_PASSES + 1):
        result = run_once(seen, f"simulating (API load, rerun {rerun} of <= {MAX_LOAD_PASSES})")
        counts = in_flight_at_send(requests_of(result))
        if counts == seen:
            break
        seen = counts
    return result
