"""The engine-step process and the host link as SimPy parts: link queues, progress, determinism."""

from types import SimpleNamespace

import simpy
from sim_workloads import make_trace, small_config

from kvlab.policies import MemOps
from kvlab.policies.outputs import TierBatch
from kvlab.sim import HostLink, RooflineCostModel, Simulation, simulate
from kvlab.sim.link import TierLinks
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


def test_tier_writes_hold_the_host_link_so_later_swaps_and_loads_queue_behind_them():
    env = simpy.Environment()
    link = HostLink(env, _cost_model())
    tiers = TierLinks(env, [SimpleNamespace(kind="host"), SimpleNamespace(kind="ssd")],
                      [(1e9, 1e9, 0.0), (1e9, 1e9, 0.5)], page_bytes=10**9, host_link=link,
                      overlap="none", num_layers=1)
    ends = {}

    def step():  # 2 s of writes to the host tier and 1 s to the SSD, nobody waiting for them
        tiers.start_writes(MemOps(tier_writes=[TierBatch(0, [0, 1], 1, [0, 1]),
                                               TierBatch(0, [2], 2, [0])]))
        yield env.timeout(0.25)
        yield from link.transfer(MemOps(swap_outs=[(3, 0)]), 1.0)  # behind the host writes
        ends["swap"] = env.now
        loads = MemOps(tier_loads=[TierBatch(1, [0], 0, [4]), TierBatch(2, [0], 0, [5])])
        yield from tiers.load(loads, 0.0)  # the host link is free; the SSD's is too
        ends["loads"] = env.now

    env.process(step())
    env.run()
    assert ends == {"swap": 3.0, "loads": 4.5}  # host: 3 + 1; SSD: 3 + 0.5 latency + 1
    assert tiers.busy_s == [3.0, 3.0] and link.busy_s == 1.0
    assert tiers.num_pages_loaded == [1, 1]


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
