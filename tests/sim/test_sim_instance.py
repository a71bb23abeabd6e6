"""The engine-step process and the host link as SimPy parts: livelock guard, link queueing."""

import pytest
import simpy
from sim_workloads import make_trace, small_config

from kvlab.policies import ArrivalQueue, MemOps, Request, SchedulerOutput
from kvlab.sim import (
    HostLink,
    LivelockError,
    RooflineCostModel,
    SimInstance,
    Simulation,
    simulate,
)
from kvlab.specs import get_hardware, get_model


class StuckScheduler:
    """A scheduler that never decides anything although a request waits (a bug to catch)."""

    def __init__(self):
        self.waiting = []
        self.running = []
        self.swapped = []
        self.step_id = 0
        self.manager = None

    def add_request(self, request):
        self.waiting.append(request)

    def has_unfinished(self):
        return bool(self.waiting)

    def schedule(self, now_s):
        self.step_id += 1
        return SchedulerOutput(step_id=self.step_id - 1, mem_ops=MemOps())


class _Usage:
    num_free_pages = num_cached_free_pages = num_total_pages = 0


class _Manager:
    def usage(self):
        return _Usage()


def _cost_model():
    return RooflineCostModel(get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=16)


def test_a_step_that_decides_nothing_while_requests_wait_is_a_livelock_error():
    env = simpy.Environment()
    scheduler = StuckScheduler()
    scheduler.manager = _Manager()
    cost_model = _cost_model()
    instance = SimInstance(
        env, scheduler, ArrivalQueue([Request(0, 10, 2)]), cost_model, HostLink(env, cost_model)
    )
    env.process(instance.run())
    with pytest.raises(LivelockError, match=r"livelock at t=0\.000000s, step 0"):
        env.run()


def test_the_host_link_carries_one_transfer_at_a_time():
    env = simpy.Environment()
    link = HostLink(env, _cost_model())
    ends = []

    def user():
        yield from link.transfer(MemOps(swap_outs=[(0, 0)]), 1.0)
        ends.append(env.now)

    env.process(user())
    env.process(user())
    env.run()
    assert ends == [1.0, 2.0]
    assert link.busy_s == 2.0 and link.num_transfers == 2


def test_the_progress_callback_counts_every_request_once():
    counted = []
    trace = make_trace([(50, 3), (9000, 2), (70, 5)])
    simulation = Simulation(trace, small_config(num_pages=256))
    simulation.instance.on_finished = counted.append
    simulation.run()
    assert sum(counted) == 3


def test_the_same_inputs_give_the_same_run():
    trace = make_trace([(300, 40), (120, 9), (500, 30)] * 3, [0.01 * i for i in range(9)])
    first = simulate(trace, small_config("paged:preemption=swap", num_pages=40))
    second = simulate(trace, small_config("paged:preemption=swap", num_pages=40))
    assert first.steps.as_dict() == second.steps.as_dict()
    assert [r.finish_s for r in first.requests] == [r.finish_s for r in second.requests]
