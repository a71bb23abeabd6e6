"""A server's API latency with a load term (kvlab.sim.api_latency): the in-flight count is the
client's, a request sent into a busy server reaches the scheduler later, the runs settle, and
a cluster of one gives what one instance gives."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from sim_workloads import make_trace, small_config

from kvlab.sim import simulate
from kvlab.sim.api_latency import (
    MAX_LOAD_PASSES,
    delay_arrivals,
    in_flight_at_send,
    run_with_api_load,
)
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.sim.cluster import simulate_cluster

BASE = CalibratedCostModel(step_overhead_s=0.01, prefill_token_s=1e-5, decode_token_s=1e-3)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=30))
def test_in_flight_counts_those_sent_before_and_not_yet_finished(spans):
    requests = [SimpleNamespace(request_id=i, arrival_s=float(sent), finish_s=float(sent + took))
                for i, (sent, took) in enumerate(spans)]
    counts = in_flight_at_send(requests)
    for request in requests:
        expected = sum(1 for other in requests
                       if other.arrival_s < request.arrival_s < other.finish_s)
        assert counts[request.request_id] == expected


def test_a_request_sent_into_a_busy_server_reaches_the_scheduler_later():
    # request 0 runs from 0 s for ~0.25 s; 1 is sent while it runs, 2 long after both ended
    trace = make_trace([(64, 20), (64, 20), (64, 20)], [0.0, 0.05, 10.0])
    flat = CalibratedCostModel(**{**BASE.coefficients(), "api_latency_s": 0.002})
    loaded = CalibratedCostModel(**{**flat.coefficients(), "api_latency_per_request_s": 0.03})
    before = simulate(trace, small_config(), cost_model=flat).requests
    after = simulate(trace, small_config(), cost_model=loaded).requests
    for b, a in zip(before, after, strict=True):
        assert a.arrival_s == b.arrival_s  # latencies still count from the send
    assert after[0].first_scheduled_s == before[0].first_scheduled_s  # nothing in flight
    assert after[2].first_scheduled_s == before[2].first_scheduled_s
    assert after[1].first_scheduled_s >= 0.05 + 0.002 + 0.03  # one in flight at its send
    assert after[1].first_scheduled_s > before[1].first_scheduled_s


def test_no_request_overtakes_one_sent_before_it_through_the_api():
    # 0 is sent into a busy server (long delay), 1 just after into a quieter one, 2 later on
    requests = [SimpleNamespace(arrival_s=sent) for sent in (1.0, 1.001, 2.0, 0.5)]
    sends = delay_arrivals(requests, [0.01, 0.002, 0.002, 0.002])
    assert sends == [1.0, 1.001, 2.0, 0.5]
    assert [r.arrival_s for r in requests] == [1.01, 1.01, 2.002, 0.502]


def test_the_runs_stop_once_the_loads_repeat_and_are_bounded():
    loaded = CalibratedCostModel(api_latency_per_request_s=0.01)
    calls, labels = [], []

    def settling(in_flight, label):
        calls.append(in_flight)
        labels.append(label)
        return [SimpleNamespace(request_id=0, arrival_s=0.0, finish_s=1.0),
                SimpleNamespace(request_id=1, arrival_s=0.5, finish_s=2.0)]

    run_with_api_load(settling, lambda result: result, loaded)
    assert calls == [None, {0: 0, 1: 1}]  # the second run saw what the first left
    assert labels == ["simulating", f"simulating (API load, rerun 1 of <= {MAX_LOAD_PASSES})"]

    def never_settling(in_flight, label):
        calls.append(in_flight)
        return [SimpleNamespace(request_id=0, arrival_s=0.0, finish_s=1.0 + len(calls) % 2),
                SimpleNamespace(request_id=1, arrival_s=1.5, finish_s=3.0)]

    calls.clear()
    run_with_api_load(never_settling, lambda result: result, loaded)
    assert len(calls) == 1 + MAX_LOAD_PASSES

    calls.clear()
    run_with_api_load(settling, lambda result: result, BASE)  # no load term: one run
    assert calls == [None]


def test_a_cluster_of_one_gives_one_instances_records_with_a_load_term():
    trace = make_trace([(64, 20)] * 6, [0.0, 0.02, 0.04, 0.06, 0.3, 0.31])
    model = CalibratedCostModel(**{**BASE.coefficients(), "api_latency_s": 0.004,
                                   "api_latency_per_request_s": 0.02})
    alone = simulate(trace, small_config(), cost_model=model).requests
    cluster = simulate_cluster(trace, small_config(), cost_model=model).cluster.requests
    for a, c in zip(alone, cluster, strict=True):
        assert (a.arrival_s, a.first_scheduled_s, a.first_token_s, a.finish_s) == (
            c.arrival_s, c.first_scheduled_s, c.first_token_s, c.finish_s)


def test_a_model_without_the_load_term_is_written_as_before_it_and_both_read_back():
    flat = CalibratedCostModel(api_latency_s=0.003)
    assert "api_latency_per_request_s" not in flat.to_json()["coefficients"]
    assert CalibratedCostModel.from_json(flat.to_json()) == flat
    loaded = CalibratedCostModel(api_latency_per_request_s=0.01)
    assert loaded.to_json()["coefficients"]["api_latency_per_request_s"] == 0.01
    assert CalibratedCostModel.from_json(loaded.to_json()) == loaded
