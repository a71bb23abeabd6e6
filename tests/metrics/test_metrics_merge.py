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


def test_added_step_columns_merge_where_every_run_has_them(record_step):
    from array import array

    def steps(*used: int, **added: list[int]) -> StepRecorder:
        recorder = StepRecorder()
        for pages in used:
            record_step(recorder, duration_s=1.0, used=pages)
        recorder.add_columns({name: array("q", values) for name, values in added.items()})
        return recorder

    both = StepRecorder()
    both.extend(steps(10, 20, mix=[1, 2], other=[5, 5]))
    both.extend(steps(30, mix=[3]))  # (no `other`: its rows would have no value)
    assert both.added_columns() == ["mix"]
    assert list(both.columns["mix"]) == [1, 2, 3] and len(both) == 3
    assert list(both.as_dict())[-1] == "mix"
    plain = StepRecorder()
    plain.extend(steps(10))
    plain.extend(steps(20, mix=[4]))
    assert plain.added_columns() == [] and len(plain) == 2
    with pytest.raises(ValueError, match="'mix': 2 values for 1 steps"):
        steps(10, mix=[1, 2])
    with pytest.raises(ValueError, match="'num_used_pages'"):
        steps(10, num_used_pages=[1])
