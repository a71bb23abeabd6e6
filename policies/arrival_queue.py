"""Requests yet to arrive: the one admission rule the simulator and the engine both follow."""

from __future__ import annotations

from collections.abc import Iterable

from kvlab.policies.request import Request
from kvlab.policies.scheduler import Scheduler


class ArrivalQueue:
    """Future requests in (arrival time, request id) order.

    The time rule shared by both worlds: a step starting at clock time t first admits every
    request whose arrival <= t; when nothing is running or waiting, the clock jumps to the next
    arrival.
    """

    __slots__ = ("_next", "_requests")

    def __init__(self, requests: Iterable[Request]) -> None:
        self._requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self._next = 0

    def __len__(self) -> int:
        return len(self._requests) - self._next

    def admit_until(self, now_s: float, scheduler: Scheduler) -> int:
        """Hand every request with arrival <= now_s to the scheduler; returns how many."""
        requests, start = self._requests, self._next
        index = start
        while index < len(requests) and requests[index].arrival_s <= now_s:
            scheduler.add_request(requests[index])
            index += 1
        self._next = index
        return index - start

    def push(self, request: Request) -> None:
        """A request arriving after every one queued (a live server's, as it comes in)."""
        requests = self._requests
        last = requests[-1] if len(requests) > self._next else None
        assert last is None or (last.arrival_s, last.request_id) <= (
            request.arrival_s, request.request_id
        ), "requests are pushed in arrival order"
        requests.append(request)

    def next_arrival_s(self) -> float | None:
        """Arrival time of the next request, or None when all have arrived."""
        return self._requests[self._next].arrival_s if self._next < len(self._requests) else None
