"""Prefill/decode disaggregation in a simulated cluster: prefill instances compute prompts and
first tokens, then hand each request's KV to a decode instance over a link, which generates
the rest.

A request routed to a prefill instance runs there with an output budget of one token: its
prefill and first token (so its TTFT is the prefill instance's), stamped at that step's end, as
any request's. When that step ends the request is handed off: its prompt's KV is
sent over the prefill instance's link to its decode instance, the least loaded one when the
handoff starts (requests held plus those on their way; ties: the lowest index), one transfer
after another (the link is one NIC: latency + bytes / bandwidth each, in order; the pages of
the prompt the decode instance caches then are not sent, as vLLM's P/D connectors pull only
what the decode side lacks). When the transfer ends the request joins that instance as a
request whose prompt KV has arrived (`Request.kv_transfer_tokens`): it decodes at once, in
pages of that instance's own (a prefix it has cached is not taken twice), and keeps its
budget. A decode instance
that preempts it recomputes it there.

Decode instances follow the time rule as every instance does: a handed-off request joins at
the first step of its instance that starts after its transfer ends (`DecodeArrivals`, each
decode instance's `ArrivalSource`). Their decode runs (the fast path) must never run past a
handoff, and a handoff is known only once a prefill step ends, so their horizon is the
earliest a handoff could still arrive: the next transfer in flight to it, or any prefill step
under way (or about to start, or to start at the trace's next arrival) plus the link latency.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Generator, Sequence
from typing import Any, Protocol

import simpy

from kvlab.errors import KvlabError
from kvlab.policies import Request, RequestStatus


class StageInstance(Protocol):
    """What the handoff needs of a cluster's instance."""

    index: int

    def num_requests(self) -> int:
        """Requests held (waiting, running, swapped, routed and not yet admitted)."""
        ...

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """Leading tokens of the request's prompt in its prefix cache now."""
        ...

    def has_work(self) -> bool:
        """True while it holds a request or one is yet to join it."""
        ...

    def step_end_s(self) -> float | None:
        """When its step under way ends (None between steps)."""
        ...

    def hand_over(self, request: Request) -> None:
        """A handed-off request joins it now (at its step start)."""
        ...

    def wake(self) -> None:
        """Resume it if it sleeps for want of work."""
        ...


def parse_pd(text: str) -> tuple[int, int]:
    """`P:D` as (prefill instances, decode instances), each at least one."""
    parts = text.split(":")
    try:
        prefill, decode = (int(part) for part in parts)
    except ValueError:
        raise KvlabError(f"pd {text!r}: expected P:D, the numbers of prefill and decode "
                         "instances, e.g. 2:6", parameters=("pd",)) from None
    if prefill < 1 or decode < 1:
        raise KvlabError(f"pd {text!r}: expected at least one prefill and one decode instance",
                         parameters=("pd",))
    return prefill, decode


def pd_num_instances(pd: tuple[int, int], num_instances: int) -> int:
    """The instances a `pd` (P, D) cluster has, P + D; a KvlabError when `num_instances` is
    neither 1 (unset) nor that."""
    prefill, decode = pd
    if num_instances not in (1, prefill + decode):
        raise KvlabError(f"num_instances is {num_instances} but pd {prefill}:{decode} makes "
                         f"{prefill + decode} instances; give one of them",
                         parameters=("num_instances", "pd"))
    return prefill + decode


class Handoffs:
    """The requests on their way from prefill to decode instances: the decode instances'
    `ArrivalSource`, and what each prefill instance calls when a step finishes requests."""

    def __init__(self, env: simpy.Environment, *, page_size: int, page_bytes: int,
                 bandwidth: float, latency_s: float) -> None:
        if bandwidth <= 0:
            raise KvlabError(f"pd link bandwidth {bandwidth!r}: expected > 0 bytes/s",
                             parameters=("pd_link_bandwidth",))
        self.env = env
        self.page_size = page_size
        self.page_bytes = page_bytes
        self.bandwidth = bandwidth
        self.latency_s = latency_s
        self.prefill: list[StageInstance] = []
        self.decode: list[StageInstance] = []
        self.budgets: dict[int, int] = {}  # request id -> its output budget, while at prefill
        self.decode_of: dict[int, int] = {}  # request id -> the decode instance it joined
        # per decode instance (by position): (transfer end, order, request), soonest first
        self._in_flight: list[list[tuple[float, int, Request]]] = []
        self._order = itertools.count()
        self._link_free_s: dict[int, float] = {}  # prefill instance -> its link's next free time
        self._next_trace_arrival: Any = None  # the cluster's arrivals' next_arrival_s
        self.num_handoffs = 0
        self.num_pages_sent = 0
        self.link_busy_s = 0.0

    def attach(self, prefill: Sequence[StageInstance], decode: Sequence[StageInstance],
               next_trace_arrival: Any) -> None:
        """The cluster's prefill and decode instances, and where its trace's next arrival is
        read (`ClusterArrivals.next_arrival_s`)."""
        self.prefill, self.decode = list(prefill), list(decode)
        self._in_flight = [[] for _ in self.decode]
        self._next_trace_arrival = next_trace_arrival

    def arrivals_of(self, position: int) -> DecodeArrivals:
        """The `ArrivalSource` of the decode instance at `position` among the decode ones."""
        return DecodeArrivals(self, position)

    def routed_to_prefill(self, request: Request) -> None:
        """A request starts at a prefill instance: its first token only, there."""
        if request.max_output_tokens > 1:
            self.budgets[request.request_id] = request.max_output_tokens
            request.max_output_tokens = 1

    def finished_at_prefill(self, prefill_index: int, finished: list[Request]) -> int:
        """A prefill step ended with `finished` (and failed) requests: hand on those with
        tokens left to generate; returns how many really finished (failures, one-token
        requests)."""
        now, done = self.env.now, 0
        for request in finished:
            budget = self.budgets.pop(request.request_id, None)
            if budget is not None:
                request.max_output_tokens = budget
            if budget is None or request.status is not RequestStatus.FINISHED_LENGTH:
                done += 1  # failed there (or asked for one token): nothing to hand on
                continue
            request.status = RequestStatus.WAITING
            request.finish_s = None
            request.num_computed_tokens = 0
            request.kv_transfer_tokens = request.prompt_len
            in_flight = self._in_flight
            position = min(range(len(self.decode)), key=lambda p: (
                self.decode[p].num_requests() + len(in_flight[p]), p))
            target = self.decode[position]
            # what the decode instance caches of the prompt now is not sent (its own pages)
            cached = target.num_cached_prefix_tokens(request) // self.page_size
            num_pages = -(-request.prompt_len // self.page_size) - cached
            seconds = self.latency_s + num_pages * self.page_bytes / self.bandwidth
            start = max(now, self._link_free_s.get(prefill_index, now))
            end = start + seconds
            self._link_free_s[prefill_index] = end
            self.decode_of[request.request_id] = target.index
            heapq.heappush(in_flight[position], (end, next(self._order), request))
            self.env.process(self._arrive_at(end, position))
            self.num_handoffs += 1
            self.num_pages_sent += num_pages
            self.link_busy_s += seconds
        return done

    def next_arrival_s(self, position: int) -> float | None:
        """The earliest a handed-off request could still join the decode instance at
        `position`: the next transfer in flight to it, or a prefill step under way (or one to
        start now, or at the trace's next arrival) plus the link latency; None when none can
        come any more."""
        in_flight = self._in_flight[position]
        bounds = [in_flight[0][0]] if in_flight else []
        now = self.env.now
        for instance in self.prefill:
            if instance.has_work():
                end = instance.step_end_s()
                bounds.append((now if end is None else end) + self.latency_s)
        trace_next = self._next_trace_arrival() if self._next_trace_arrival else None
        if trace_next is not None:
            bounds.append(trace_next + self.latency_s)
        return min(bounds) if bounds else None

    def deliver_until(self, position: int, now_s: float) -> None:
        """Every request on its way to the decode instance at `position` whose transfer ended
        by `now_s` joins it (called as its step starts)."""
        in_flight, target = self._in_flight[position], self.decode[position]
        while in_flight and in_flight[0][0] <= now_s:
            _, _, request = heapq.heappop(in_flight)
            target.hand_over(request)

    def _arrive_at(self, end_s: float, position: int) -> Generator[simpy.Event, Any, None]:
        """Wake the decode instance when a transfer to it ends (it admits the request at its
        next step start)."""
        yield self.env.timeout(end_s - self.env.now)
        self.decode[position].wake()

    def stats(self) -> dict[str, Any]:
        """The handoffs' counters for the summary."""
        return {"pd_handoffs": self.num_handoffs, "pd_transferred_pages": self.num_pages_sent,
                "pd_link_busy_s": self.link_busy_s}


class DecodeArrivals:
    """One decode instance's `ArrivalSource`: the requests handed off to it."""

    __slots__ = ("_handoffs", "_position")

    def __init__(self, handoffs: Handoffs, position: int) -> None:
        self._handoffs = handoffs
        self._position = position

    def next_arrival_s(self) -> float | None:
        """The earliest a handed-off request could still join this instance."""
        return self._handoffs.next_arrival_s(self._position)

    def deliver_until(self, now_s: float) -> None:
        """The requests whose transfer to this instance ended by `now_s` join it."""
        self._handoffs.deliver_until(self._position, now_s)
