"""Routing on arrival in a simulated cluster: the cluster's requests yet to arrive, each routed
to an instance when it arrives, on the state of the instances at that moment. Since any
arrival may go to any instance, this one source is every instance's `ArrivalSource`: each
instance's decode runs stop at the next arrival of the whole cluster, which keeps the fast path
exact.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import simpy

from kvlab.policies import Request
from kvlab.sim.arrival_process import arrival_process
from kvlab.sim.router import Router

if TYPE_CHECKING:
    from kvlab.sim.cluster_instance import ClusterInstance


class ClusterArrivals:
    """The cluster's requests yet to arrive, routed to an instance as each arrives: every
    instance's `ArrivalSource`."""

    __slots__ = ("_next", "_requests", "instance_of", "instances", "router")
    # `instances`: those arrivals are routed to (all, or the prefill ones)

    def __init__(self, requests: Sequence[Request], router: Router) -> None:
        self._requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self._next = 0
        self.router = router
        self.instances: list[ClusterInstance] = []
        self.instance_of: dict[int, int] = {}

    def next_arrival_s(self) -> float | None:
        """When the next request of the whole cluster arrives (None when all have)."""
        requests, index = self._requests, self._next
        return requests[index].arrival_s if index < len(requests) else None

    def deliver_until(self, now_s: float) -> None:
        """Route every request arrived by `now_s`, one by one in arrival order, each on the
        state the ones before it left (a routed request counts in its instance's load)."""
        requests, instances, choose = self._requests, self.instances, self.router.choose
        index = self._next
        while index < len(requests) and requests[index].arrival_s <= now_s:
            request = requests[index]
            chosen = instances[choose(request, instances)]
            chosen.submit(request)
            self.instance_of[request.request_id] = chosen.index
            index += 1
            self._next = index

    def process(self, env: simpy.Environment) -> Generator[simpy.Event, Any, None]:
        """SimPy process body: route at each distinct arrival time; at the end, wake every
        instance so that the idle ones see no more work is coming and stop."""
        yield from arrival_process(env, (r.arrival_s for r in self._requests),
                                   lambda: self.deliver_until(env.now))
        for instance in self.instances:
            instance.instance.wake()
