"""Properties of every scheduling order (hypothesis): requests are conserved (each arrived
request is in exactly one place, step after step, and ends finished), and `priority` admits
in (priority, arrival) order and preempts by vLLM's rule."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.policies import RequestStatus, registry
from kvlab.policies.scheduling.priority import priority_key
from tests.policies.test_scheduler_properties import run_workload, workloads

ORDERS = ["fcfs", "priority", "lpm", "lpm:max_queue=2,in_batch=0", "sjf", "sjf:max_wait_s=0.05",
          "sjf-oracle"]


@st.composite
def ordered_workloads(draw, orders=ORDERS):
    spec, num_pages, config, requests = draw(workloads())
    for request in requests:
        request.priority = draw(st.integers(0, 3))
    order = draw(st.sampled_from(orders))
    return spec, num_pages, dataclasses.replace(config, scheduling_policy=order), requests


def test_every_registered_order_is_exercised():
    assert {name.partition(":")[0] for name in ORDERS} == set(registry.names("scheduling"))


@settings(max_examples=150)
@given(workload=ordered_workloads())
def test_every_order_conserves_requests(workload):
    spec, num_pages, config, requests = workload
    arrived: set[int] = set()
    holder = {}

    def check(output):
        scheduler = holder["scheduler"]
        places = [r.request_id for queue in (scheduler.waiting, scheduler.running,
                                             scheduler.swapped) for r in queue]
        assert len(places) == len(set(places)), "a request is in two places"
        done = {r.request_id for r in requests if r.is_finished}
        assert not done & set(places)
        arrived.update(places)
        assert set(places) | done >= arrived, "a request went missing"

    def run_checked():
        from kvlab.policies import Scheduler

        original = Scheduler.__init__

        def remember(self, *args, **kwargs):
            original(self, *args, **kwargs)
            holder["scheduler"] = self

        Scheduler.__init__ = remember  # type: ignore[method-assign]
        try:
            return run_workload(spec, num_pages, config, requests, check_step=check)
        finally:
            Scheduler.__init__ = original  # type: ignore[method-assign]

    manager, scheduler = run_checked()
    assert not scheduler.has_unfinished()
    assert all(r.is_finished for r in requests)
    assert {r.status for r in requests} <= {RequestStatus.FINISHED_LENGTH,
                                            RequestStatus.FINISHED_ERROR}
    assert manager.usage().num_used_pages == 0


@settings(max_examples=150)
@given(workload=ordered_workloads(orders=["priority"]))
def test_priority_never_admits_a_lower_request_ahead_of_a_waiting_higher_one(workload):
    spec, num_pages, config, requests = workload
    holder: dict = {}

    def check(output):
        scheduler = holder["scheduler"]
        admitted = [r for r in output.requests if r.request_id in holder["waiting_before"]
                    and r.status is RequestStatus.RUNNING]
        still_waiting = [priority_key(r) for r in scheduler.waiting]
        for request in admitted:  # the admitted are a prefix of the queue in vLLM's order
            assert all(priority_key(request) < key for key in still_waiting)
        if output.preempted:  # each victim was the lowest of the running requests then
            last_victim = min(_victim_key(r) for r in output.preempted)
            assert all(_victim_key(r) <= last_victim for r in scheduler.running)
        holder["waiting_before"] = set()

    from kvlab.policies import Scheduler

    original_schedule = Scheduler.schedule

    def schedule(self, now_s=0.0):
        holder["scheduler"] = self
        holder["waiting_before"] = {r.request_id for r in self.waiting}
        return original_schedule(self, now_s)

    Scheduler.schedule = schedule  # type: ignore[method-assign]
    try:
        run_workload(spec, num_pages, config, requests, check_step=check)
    finally:
        Scheduler.schedule = original_schedule  # type: ignore[method-assign]


def _victim_key(request):
    return (request.priority, request.arrival_s)
