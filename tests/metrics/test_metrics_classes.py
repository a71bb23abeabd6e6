"""Per-class metrics: each SLO class's latencies and goodput, Jain's fairness over the classes,
priority inversions; and none of it for a run without classes."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.cli.report import format_report
from kvlab.metrics import summarize
from kvlab.metrics.classes import count_priority_inversions, jain_index
from kvlab.metrics.tables import per_request_table
from tests.metrics.conftest import build_request, build_result


def _classed(request_id, slo_class, *, priority=0, first_token_s=1.0, finish_s=2.0,
             arrival_s=0.0):
    request = build_request(request_id, first_token_s=first_token_s, finish_s=finish_s,
                            arrival_s=arrival_s)
    request.slo_class, request.priority = slo_class, priority
    return request


def test_jain_index_is_one_for_equal_shares_and_one_over_n_for_one_holder():
    assert jain_index([0.5, 0.5, 0.5]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([1.0, 3.0]) == pytest.approx(16 / 20)
    assert jain_index([]) is None
    assert jain_index([0.0, 0.0]) == 1.0


def test_an_inversion_is_a_lower_request_started_while_a_higher_one_waited():
    arrival = np.array([0.0, 0.0, 1.0, 5.0])
    started = np.array([2.0, 1.0, 3.0, np.nan])  # request 3 never ran
    priority = np.array([0, 1, 1, 0])
    # request 1 (priority 1) started at 1.0 while request 0 (priority 0, arrived 0.0) waited
    # until 2.0: one inversion; request 2 started at 3.0, after 0 started, before 3 arrived
    assert count_priority_inversions(arrival, started, priority) == 1
    # request 3, waiting forever from 5.0, inverts with any lower request starting after 5
    started2 = np.array([2.0, 1.0, 6.0, np.nan])
    assert count_priority_inversions(arrival, started2, priority) == 2
    assert count_priority_inversions(arrival, started, np.zeros(4, dtype=np.int64)) == 0


def test_a_run_without_classes_has_no_class_keys():
    summary = summarize(build_result([build_request(0), build_request(1)]))
    assert not {"classes", "fairness_jain", "num_priority_inversions"} & set(summary)
    assert "slo_class" not in per_request_table(build_result([build_request(0)]))


def test_each_class_has_its_latencies_and_its_own_slos_goodput():
    requests = [_classed(0, "chat", first_token_s=0.1, finish_s=1.0),
                _classed(1, "chat", first_token_s=0.9, finish_s=2.0),
                _classed(2, "batch", first_token_s=5.0, finish_s=9.0)]
    slos = {"chat": {"ttft": 500.0}, "batch": {"e2el": 10_000.0}}
    summary = summarize(build_result(requests, duration_s=10.0,
                                     metadata={"slo_classes": slos}))
    chat, batch = summary["classes"]["chat"], summary["classes"]["batch"]
    assert chat["completed"] == 2 and batch["completed"] == 1
    assert chat["mean_ttft_ms"] == pytest.approx(500.0)
    assert chat["goodput_perc"] == pytest.approx(50.0)  # one of two within 500 ms
    assert batch["goodput_perc"] == pytest.approx(100.0)
    assert chat["request_goodput"] == pytest.approx(0.1)
    assert summary["fairness_jain"] == pytest.approx(150**2 / (2 * (50**2 + 100**2)))
    assert summary["num_priority_inversions"] == 0
    table = per_request_table(build_result(requests))
    assert table["slo_class"].tolist() == ["chat", "chat", "batch"]


def test_without_class_slos_the_global_goodput_applies_and_priorities_make_classes():
    requests = [_classed(0, None, priority=0, first_token_s=0.2),
                _classed(1, None, priority=1, first_token_s=3.0)]
    summary = summarize(build_result(requests), goodput_slos={"ttft": 1000.0})
    assert set(summary["classes"]) == {"priority 0", "priority 1"}
    assert summary["classes"]["priority 0"]["goodput_perc"] == 100.0
    assert summary["classes"]["priority 1"]["goodput_perc"] == 0.0
    assert summary["fairness_jain"] == pytest.approx(0.5)


def test_the_report_prints_each_class_and_the_fairness():
    requests = [_classed(0, "chat"), _classed(1, "batch", priority=1)]
    summary = summarize(build_result(requests), goodput_slos={"ttft": 2000.0})
    text = format_report(summary)
    assert "SLO Classes" in text
    assert "chat within SLO (%):" in text and "batch P99 TTFT (ms):" in text
    assert "Jain's fairness (SLO attainment):" in text
    assert "Priority inversions:" in text


def test_the_comparison_shows_each_class_side_by_side():
    from kvlab.cli.report import format_comparison

    fast = summarize(build_result([_classed(0, "chat", first_token_s=0.1)]),
                     goodput_slos={"ttft": 500.0})
    slow = summarize(build_result([_classed(0, "chat", first_token_s=0.9)]),
                     goodput_slos={"ttft": 500.0})
    text = format_comparison([fast, slow], ["fast", "slow"])
    row = next(line for line in text.splitlines() if line.startswith("chat within SLO (%):"))
    assert row.split()[-2:] == ["100.00", "0.00"]
    assert "Priority inversions:" in text
    plain = format_comparison([summarize(build_result([build_request(0)]))], ["plain"])
    assert "within SLO" not in plain
