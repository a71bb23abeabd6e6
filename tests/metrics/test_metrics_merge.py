"""merge_runs: several runs summarized as one pool of requests."""

import pytest

from kvlab.metrics import StepRecorder, merge_runs, summarize


def test_merged_runs_pool_requests_time_and_steps(make_request, make_result, record_step):
    steps_a, steps_b = StepRecorder(), StepRecorder()
    record_step(steps_a, duration_s=1.0, used=80)
    record_step(steps_b, duration_s=3.0, used=40)
    first = make_result(
        [make_request(0, first_token_s=0.1, output_len=10)], steps=steps_a, itls_s=[0.5],
        duration_s=2.0, metadata={"dataset": "a", "num_prompts": 1},
    )
    second = make_result(
        [make_request(i, first_token_s=0.4, output_len=10) for i in (1, 2)], steps=steps_b,
        itls_s=[0.25, 0.75], duration_s=6.0, metadata={"dataset": "b", "num_prompts": 2},
    )
    merged = merge_runs([first, second])
    summary = summarize(merged)
    assert [r.request_id for r in merged.requests] == [0, 1, 2]
    assert merged.duration_s == 8.0 and len(merged.steps) == 2
    assert merged.metadata == {"dataset": "a", "num_prompts": 3}
    assert summary["mean_ttft_ms"] == pytest.approx(1000 * (0.1 + 0.4 + 0.4) / 3)
    assert summary["output_throughput"] == pytest.approx(30 / 8.0)
    assert summary["mean_itl_ms"] == pytest.approx(500.0)
    assert summary["mean_kv_usage_perc"] == pytest.approx(0.25 * 80 + 0.75 * 40)
    assert len(first.requests) == 1 and len(first.steps) == 1  # the inputs are untouched


def test_one_run_merges_to_itself_and_none_is_an_error(make_result):
    run = make_result()
    assert merge_runs([run]) is run
    with pytest.raises(ValueError):
        merge_runs([])


def test_runs_over_different_memories_do_not_merge(make_result):
    other = make_result()
    other.page_size = 32
    with pytest.raises(ValueError, match="KV memory"):
        merge_runs([make_result(), other])
