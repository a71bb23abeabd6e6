"""The time rule of docs/architecture.md: admission at step start, tokens stamped at step end,
idle jumps."""

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_workloads import make_trace, small_config

from kvlab.sim import simulate
from kvlab.sim.arrival_process import delay_until


def _steps(result):
    columns = result.steps.columns
    return list(columns["start_s"]), list(columns["duration_s"])


def test_an_idle_instance_jumps_to_the_next_arrival():
    result = simulate(make_trace([(64, 3), (64, 3)], [0.0, 100.0]), small_config())
    starts, durations = _steps(result)
    late = result.requests[1]
    assert late.first_scheduled_s == 100.0
    assert 100.0 in starts
    # no step runs in the gap: the one before 100 s ends long before it
    before = [s + d for s, d in zip(starts, durations, strict=True) if s < 100.0]
    assert max(before) < 1.0


def test_tokens_are_stamped_with_the_end_of_the_step_that_made_them():
    result = simulate(make_trace([(64, 3)]), small_config())
    starts, durations = _steps(result)
    request = result.requests[0]
    assert request.first_token_s == starts[0] + durations[0]
    assert request.finish_s == starts[2] + durations[2]
    assert list(result.itls_s) == pytest.approx([durations[1], durations[2]])


def test_a_request_arriving_mid_step_joins_at_the_next_step_start():
    first = simulate(make_trace([(2000, 2)]), small_config(num_pages=512))
    prefill_s = first.steps.columns["duration_s"][0]
    trace = make_trace([(2000, 2), (64, 2)], [0.0, prefill_s / 2])
    result = simulate(trace, small_config(num_pages=512))
    assert result.requests[1].first_scheduled_s == prefill_s


def test_each_step_starts_when_the_previous_one_ends_while_work_remains():
    result = simulate(make_trace([(300, 40)] * 4), small_config())
    starts, durations = _steps(result)
    for index in range(1, len(starts)):
        assert starts[index] == starts[index - 1] + durations[index - 1]


def test_an_arrival_at_an_awkward_float_time_is_admitted_exactly_then():
    arrival = 0.1 + 0.2  # 0.30000000000000004
    result = simulate(make_trace([(64, 2), (64, 2)], [0.0, arrival]), small_config())
    assert result.requests[1].first_scheduled_s == arrival


@given(
    now=st.floats(0.0, 1e7, allow_nan=False),
    gap=st.floats(0.0, 1e7, allow_nan=False),
)
def test_delay_until_lands_exactly_on_the_target(now, gap):
    target = now + gap
    assert now + delay_until(now, target) == target
    assert delay_until(now, target) >= 0.0


def test_delay_until_a_past_time_is_zero():
    assert delay_until(5.0, 4.0) == 0.0
    assert not math.isnan(delay_until(0.0, 0.0))


def test_a_target_no_float_sum_reaches_is_passed_by_one_ulp_at_most():
    # a client's measured send times (calibrate --from-bench) hit such pairs
    now, target = 0.016619412984077618, 0.1028597969841983
    delay = delay_until(now, target)
    assert now + delay >= target
    assert now + math.nextafter(delay, 0.0) < target


def test_arrivals_at_measured_float_times_are_all_admitted():
    arrivals = [0.0, 0.016619412984077618, 0.1028597969841983]
    result = simulate(make_trace([(16, 2)] * 3, arrivals), small_config())
    assert all(r.first_scheduled_s is not None and r.first_scheduled_s >= r.arrival_s
               for r in result.requests)


def test_a_servers_api_latency_delays_the_scheduler_not_the_arrival():
    from kvlab.sim.calibrated import CalibratedCostModel

    trace = make_trace([(64, 3), (64, 3)], [0.0, 100.0])
    base = CalibratedCostModel(step_overhead_s=0.01, decode_token_s=0.001)
    plain = simulate(trace, small_config(), cost_model=base)
    delayed = simulate(trace, small_config(),
                       cost_model=dataclasses.replace(base, api_latency_s=0.25))
    for before, after in zip(plain.requests, delayed.requests, strict=True):
        assert after.arrival_s == before.arrival_s  # latencies count from the client's send
        assert after.first_scheduled_s == pytest.approx(before.first_scheduled_s + 0.25)
        assert after.first_token_s == pytest.approx(before.first_token_s + 0.25)
        assert after.finish_s == pytest.approx(before.finish_s + 0.25)
