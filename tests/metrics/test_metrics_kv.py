"""KV-cache metrics on hand-made step records, counters, and the per-request and per-step tables."""

import numpy as np
import pytest

from kvlab.metrics import STEP_COLUMNS, StepRecorder, per_request_table, per_step_table, summarize
from kvlab.policies.request import RequestStatus

# conftest's pool: 100 pages of 16 slots


def _two_steps(record_step, first: dict, second: dict) -> StepRecorder:
    """A 1-second step then a 3-second step, so time weights are 1/4 and 3/4."""
    steps = StepRecorder()
    record_step(steps, duration_s=1.0, **first)
    record_step(steps, duration_s=3.0, **second)
    return steps


def test_mean_kv_usage_is_weighted_by_step_duration(record_step, make_result):
    steps = _two_steps(record_step, {"used": 80}, {"used": 40})
    summary = summarize(make_result(steps=steps))
    assert summary["mean_kv_usage_perc"] == pytest.approx(0.25 * 80 + 0.75 * 40)


def test_peak_kv_usage_is_the_fullest_step(record_step, make_result):
    steps = _two_steps(record_step, {"used": 80}, {"used": 40})
    assert summarize(make_result(steps=steps))["peak_kv_usage_perc"] == pytest.approx(80.0)


def test_token_state_share_is_live_over_held_slots_over_time(record_step, make_result):
    # held slots: 10 x 16 = 160 for 1 s, 20 x 16 = 320 for 3 s; live: 80 then 320
    steps = _two_steps(
        record_step, {"used": 10, "live": 80, "internal": 80}, {"used": 20, "live": 320}
    )
    summary = summarize(make_result(steps=steps))
    expected = 100.0 * (1 * 80 + 3 * 320) / (1 * 160 + 3 * 320)
    assert summary["kv_token_state_perc"] == pytest.approx(expected)


def test_internal_fragmentation_is_a_share_of_held_slots(record_step, make_result):
    steps = _two_steps(
        record_step, {"used": 10, "live": 80, "internal": 80}, {"used": 20, "live": 320}
    )
    summary = summarize(make_result(steps=steps))
    assert summary["internal_fragmentation_perc"] == pytest.approx(100.0 * 80 / (160 + 960))
    assert summary["internal_fragmentation_perc"] + summary["kv_token_state_perc"] == (
        pytest.approx(100.0)
    )


def test_external_fragmentation_is_a_share_of_all_pages(record_step, make_result):
    steps = _two_steps(record_step, {"used": 50, "external": 20}, {"used": 50, "external": 0})
    summary = summarize(make_result(steps=steps))
    assert summary["external_fragmentation_perc"] == pytest.approx(0.25 * 20)


def test_kv_metrics_without_steps_are_zero(make_request, make_result):
    summary = summarize(make_result([make_request(0)]))
    keys = ("mean_kv_usage_perc", "peak_kv_usage_perc", "kv_token_state_perc",
            "internal_fragmentation_perc", "external_fragmentation_perc")  # fmt: skip
    assert [summary[k] for k in keys] == [0.0] * 5


def test_steps_that_take_no_time_weigh_equally(record_step, make_result):
    steps = StepRecorder()
    record_step(steps, duration_s=0.0, used=10)
    record_step(steps, duration_s=0.0, used=30)
    assert summarize(make_result(steps=steps))["mean_kv_usage_perc"] == pytest.approx(20.0)


def test_kv_cache_size_and_pool_shape_are_reported(make_result):
    summary = summarize(make_result())
    assert (summary["kv_cache_size_tokens"], summary["page_size"]) == (1600, 16)
    assert summary["num_total_pages"] == 100


def test_prefix_cache_hit_rate_counts_prompts_that_were_looked_up(
    make_request, make_failed, make_result
):
    requests = [
        make_request(0, prompt_len=100, num_cached_tokens=64),
        make_request(1, prompt_len=100, num_cached_tokens=16),
        # never scheduled: its prompt was never looked up
        make_failed(2, prompt_len=1000),
    ]
    assert summarize(make_result(requests))["prefix_cache_hit_rate_perc"] == pytest.approx(40.0)


def test_preemption_and_swap_events_are_summed_over_requests(make_request, make_result):
    requests = [
        make_request(0, num_preemptions=3, num_swaps_out=2),
        make_request(1, num_preemptions=1, num_swaps_out=1, status=RequestStatus.FINISHED_ABORTED),
    ]
    summary = summarize(make_result(requests))
    assert summary["num_preemptions"] == 4
    assert summary["num_swaps_out"] == 3
    # only the completed request is known to have come back after each swap-out
    assert summary["num_swaps_in"] == 2


def test_swapped_pages_are_summed_over_steps(record_step, make_result):
    steps = StepRecorder()
    record_step(steps, swap_outs=[(1, 0), (2, 1), (7, 2)])
    record_step(steps, swap_ins=[(0, 5)])
    record_step(steps, swap_ins=[(1, 6), (2, 9)])
    summary = summarize(make_result(steps=steps))
    assert (summary["num_swap_out_pages"], summary["num_swap_in_pages"]) == (3, 3)


def test_per_step_table_has_the_recorder_columns(record_step, make_result):
    steps = _two_steps(record_step, {"used": 80, "live": 7}, {"used": 40})
    table = per_step_table(make_result(steps=steps))
    assert tuple(table.columns) == STEP_COLUMNS
    assert table["num_used_pages"].tolist() == [80, 40]
    assert table["num_live_token_slots"].dtype == np.int64
    assert table["start_s"].tolist() == [0.0, 1.0]


def test_per_request_table_has_one_row_per_request(make_request, make_failed, make_result):
    requests = [
        make_request(0, arrival_s=1.0, first_token_s=1.1, finish_s=2.1, output_len=5),
        make_failed(1, prompt_len=5000),
    ]
    table = per_request_table(make_result(requests))
    assert list(table.columns) == [
        "request_id", "arrival_s", "input_len", "output_len", "status", "error", "ttft_ms",
        "tpot_ms", "e2el_ms", "num_cached_tokens", "num_preemptions", "num_swaps_out",
        "first_scheduled_s", "finish_s",
    ]  # fmt: skip
    done, failed = table.iloc[0], table.iloc[1]
    assert done["ttft_ms"] == pytest.approx(100.0)
    assert done["tpot_ms"] == pytest.approx(250.0)
    assert done["e2el_ms"] == pytest.approx(1100.0)
    assert done["status"] == "finished_length"
    assert failed["status"] == "finished_error"
    assert failed["error"].startswith("prompt of 5000")
    assert np.isnan(failed["ttft_ms"]) and np.isnan(failed["first_scheduled_s"])


def test_completed_request_without_stamps_is_rejected(make_request, make_result):
    broken = make_request(0, first_token_s=None)
    with pytest.raises(ValueError, match="first_token_s"):
        summarize(make_result([broken]))
