"""The engine-step process and the host link as SimPy parts: link queues, progress, determinism."""

import simpy
from sim_workloads import make_trace, small_config

from kvlab.policies import MemOps
from kvlab.sim import HostLink, RooflineCostModel, Simulation, simulate
from kvlab.specs import get_hardware, get_model


def _cost_model():
    return RooflineCostModel(get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=16)


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
    simulation.instance.on_finished = lambda ended: counted.append(len(ended))
    simulation.run()
    assert sum(counted) == 3


def test_the_same_inputs_give_the_same_run():
    trace = make_trace([(300, 40), (120, 9), (500, 30)] * 3, [0.01 * i for i in range(9)])
    first = simulate(trace, small_config("paged:preemption=swap", num_pages=40))
    second = simulate(trace, small_config("paged:preemption=swap", num_pages=40))
    assert first.steps.as_dict() == second.steps.as_dict()
    assert [r.finish_s for r in first.requests] == [r.finish_s for r in second.requests]
