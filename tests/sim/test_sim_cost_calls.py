"""The cost-model contract lockstep validation relies on: one step_time_s call per step, in order,
and memory work charged through swap_time_s / copy_time_s."""

import gc

import pytest
from sim_workloads import make_trace, small_config

from kvlab.policies.outputs import MemOps
from kvlab.sim import RooflineCostModel, Simulation, simulate, simulate_cluster
from kvlab.specs import get_hardware, get_model


class ReplayCostModel:
    """Replays fixed step durations (as `kvlab validate` replays an engine's) and logs the calls."""

    def __init__(self, durations_s):
        self.durations_s = list(durations_s)
        self.step_ids = []

    def step_time_s(self, output):
        self.step_ids.append(output.step_id)
        return self.durations_s[len(self.step_ids) - 1]

    def swap_time_s(self, num_pages, num_transfers):
        return 0.0

    def copy_time_s(self, num_pages):
        return 0.0

    def recompute_time_s(self, num_tokens):
        return 0.0


class LoggingRoofline(RooflineCostModel):
    """The roofline, remembering what it charged per step."""

    def __init__(self, page_size):
        super().__init__(get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=page_size)
        self.charged = []

    def step_time_s(self, shape):
        seconds = super().step_time_s(shape)
        self.charged.append(seconds)
        return seconds


TRACE = make_trace([(120, 30), (400, 12), (33, 50), (200, 20)], [0.0, 0.0, 0.05, 0.3])


def test_step_time_is_asked_once_per_step_in_step_order():
    cost_model = ReplayCostModel([0.01 * (1 + i % 3) for i in range(1000)])
    result = simulate(TRACE, small_config(), cost_model=cost_model)
    num_steps = len(result.steps)
    assert cost_model.step_ids == list(range(num_steps))
    assert list(result.steps.columns["step_id"]) == list(range(num_steps))


def test_replayed_durations_drive_the_clock_exactly():
    durations = [0.01 * (1 + i % 3) for i in range(1000)]
    result = simulate(TRACE, small_config(), cost_model=ReplayCostModel(durations))
    starts = result.steps.columns["start_s"]
    # the instance never idles on this trace, so each step starts where the last one ended
    for index in range(1, len(starts)):
        assert starts[index] == starts[index - 1] + durations[index - 1]


def test_swap_and_copy_time_add_to_the_step_that_carries_them():
    cost_model = LoggingRoofline(page_size=16)
    trace = make_trace([(200, 120)] * 6)
    simulation = Simulation(
        trace, small_config("paged:preemption=swap", num_pages=48), cost_model=cost_model
    )
    result = simulation.run()
    columns = result.steps.columns
    swap_steps = [i for i, n in enumerate(columns["num_swap_out_pages"]) if n]
    assert swap_steps, "the workload must swap"
    for index in swap_steps:
        expected = (
            cost_model.charged[index]
            + cost_model.swap_time_s(
                columns["num_swap_out_pages"][index], columns["num_swap_out_transfers"][index]
            )
            + cost_model.swap_time_s(
                columns["num_swap_in_pages"][index], columns["num_swap_in_transfers"][index]
            )
            + cost_model.copy_time_s(columns["num_copied_pages"][index])
        )
        assert columns["duration_s"][index] == pytest.approx(expected, rel=1e-12)
    assert simulation.link.busy_s > 0.0
    assert result.requests[0].status.is_finished


def test_scattered_pages_cost_more_link_time_than_one_run():
    simulation = Simulation(make_trace([(10, 1)]), small_config())
    link = simulation.link
    one_run = MemOps(swap_outs=[(i, i) for i in range(8)])
    scattered = MemOps(swap_outs=[(2 * i, i) for i in range(8)])
    assert link.swap_time_s(scattered) > link.swap_time_s(one_run) > 0.0


class FixedPreemptionCosts:
    """Measured-style swap and recompute costs, apart from the step timing."""

    def __init__(self, swap_s, recompute_s):
        self.swap_s, self.recompute_s = swap_s, recompute_s

    def swap_time_s(self, num_pages, num_transfers):
        return self.swap_s

    def recompute_time_s(self, num_tokens):
        return self.recompute_s


@pytest.mark.parametrize(("swap_s", "expect_swaps"), [(1.0, False), (0.001, True)])
def test_auto_preemption_weighs_the_given_costs_not_the_replayed_step_model(swap_s, expect_swaps):
    trace = make_trace([(200, 120)] * 6)
    result = simulate(
        trace,
        small_config("paged:preemption=auto", num_pages=48),
        cost_model=ReplayCostModel([0.01] * 10_000),
        preemption_costs=FixedPreemptionCosts(swap_s, recompute_s=0.1),
    )
    assert sum(r.num_preemptions for r in result.requests) > 0
    assert (sum(r.num_swaps_out for r in result.requests) > 0) is expect_swaps


class GcWatchingRoofline(LoggingRoofline):
    """The roofline, noting whether the cyclic collector was on at each step; fails at a step
    when told to."""

    def __init__(self, page_size, fail_at_step=None):
        super().__init__(page_size)
        self.collector_on = []
        self.fail_at_step = fail_at_step

    def step_time_s(self, shape):
        self.collector_on.append(gc.isenabled())
        if len(self.collector_on) == self.fail_at_step:
            raise RuntimeError("the cost model failed")
        return super().step_time_s(shape)


@pytest.mark.parametrize("run", [simulate, simulate_cluster])
def test_a_run_pauses_the_cyclic_collector_and_restores_it(run):
    config = small_config()
    cost_model = GcWatchingRoofline(16)
    run(TRACE, config, cost_model=cost_model, decode_runs=False)
    assert cost_model.collector_on and not any(cost_model.collector_on)
    assert gc.isenabled()
    failing = GcWatchingRoofline(16, fail_at_step=2)
    with pytest.raises(RuntimeError, match="the cost model failed"):
        run(TRACE, config, cost_model=failing, decode_runs=False)
    assert gc.isenabled()
