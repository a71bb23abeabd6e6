"""Lockstep for every scheduling order: the engine and the simulator replaying its step times
admit and preempt alike under fcfs, priority, lpm and sjf (the order lives in the shared
scheduler, so a difference is a bug)."""

from __future__ import annotations

import dataclasses

import pytest

from kvlab.engine.interleave import run_engine
from kvlab.fidelity import lockstep, sim_config_for
from kvlab.policies import registry
from tests.validate.test_lockstep_policies import engine_config, small_trace

ORDERS = ["fcfs", "priority", "lpm", "sjf", "sjf-oracle"]


def test_every_order_has_a_lockstep_case():
    assert set(ORDERS) == set(registry.names("scheduling"))


@pytest.mark.parametrize("order", ORDERS)
def test_lockstep_is_identical_for_every_scheduling_order(order):
    trace = small_trace()
    priorities = [2, 0, 1, 3, 0, 1, 2]
    trace = dataclasses.replace(trace, requests=[
        dataclasses.replace(r, priority=p, slo_class="hi" if p < 2 else "lo")
        for r, p in zip(trace.requests, priorities, strict=True)])
    config = engine_config("paged:block_size=4,eviction=lru", scheduling_policy=order)
    result, engine, ran = run_engine(config, trace)
    sim_config = sim_config_for(engine)
    assert sim_config.serving.scheduling_policy == order
    report = lockstep(result, ran, sim_config, engine.preemption_costs)
    assert report.identical, report.describe()
    assert sum(r.num_preemptions for r in result.requests) > 0
    assert {r.priority for r in result.requests} == set(priorities)
