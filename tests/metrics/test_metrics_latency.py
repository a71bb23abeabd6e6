"""vLLM's bench metrics on hand-made requests: counts, rates, TTFT, TPOT, ITL, E2EL, goodput."""

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.metrics import (
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    percentile_label,
    summarize,
)
from kvlab.policies.request import RequestStatus

ALL = ("ttft", "tpot", "itl", "e2el")


def test_ttft_is_first_token_minus_arrival(make_request, make_result):
    requests = [
        make_request(0, arrival_s=1.0, first_token_s=1.25, finish_s=3.0),
        make_request(1, arrival_s=2.0, first_token_s=2.75, finish_s=4.0),
    ]
    summary = summarize(make_result(requests))
    assert summary["mean_ttft_ms"] == pytest.approx(500.0)
    assert summary["median_ttft_ms"] == pytest.approx(500.0)


def test_e2el_is_finish_minus_arrival(make_request, make_result):
    requests = [make_request(0, arrival_s=1.0, first_token_s=1.5, finish_s=4.0)]
    summary = summarize(make_result(requests), percentile_metrics=("e2el",))
    assert summary["mean_e2el_ms"] == pytest.approx(3000.0)


def test_tpot_is_decode_time_over_output_tokens_after_the_first(make_request, make_result):
    # (latency 2.1 - ttft 0.1) / (5 - 1) = 0.5 s
    requests = [make_request(0, arrival_s=0.0, first_token_s=0.1, finish_s=2.1, output_len=5)]
    summary = summarize(make_result(requests))
    assert summary["mean_tpot_ms"] == pytest.approx(500.0)


def test_single_token_requests_are_left_out_of_tpot(make_request, make_result):
    requests = [
        make_request(0, first_token_s=0.1, finish_s=2.1, output_len=5),
        make_request(1, first_token_s=0.1, finish_s=0.1, output_len=1),
    ]
    summary = summarize(make_result(requests))
    assert summary["mean_tpot_ms"] == pytest.approx(500.0)
    assert summary["completed"] == 2


def test_itl_statistics_come_from_the_given_gaps(make_request, make_result):
    result = make_result([make_request(0)], itls_s=[0.01, 0.02, 0.03, 0.10])
    summary = summarize(result, metric_percentiles=(50, 99))
    assert summary["mean_itl_ms"] == pytest.approx(40.0)
    assert summary["median_itl_ms"] == pytest.approx(25.0)
    assert summary["p50_itl_ms"] == pytest.approx(25.0)


def test_percentiles_interpolate_linearly_like_numpy(make_request, make_result):
    ttfts = [0.1, 0.2, 0.3, 0.4, 1.0]
    requests = [
        make_request(i, arrival_s=0.0, first_token_s=t, finish_s=2.0) for i, t in enumerate(ttfts)
    ]
    summary = summarize(make_result(requests), metric_percentiles=(90, 99.9))
    assert summary["p90_ttft_ms"] == pytest.approx(760.0)
    assert summary["p99.9_ttft_ms"] == pytest.approx(np.percentile(ttfts, 99.9) * 1000)


def test_std_is_the_population_std(make_request, make_result):
    requests = [
        make_request(0, first_token_s=0.1, finish_s=2.0),
        make_request(1, first_token_s=0.3, finish_s=2.0),
    ]
    assert summarize(make_result(requests))["std_ttft_ms"] == pytest.approx(100.0)


def test_percentile_keys_are_named_like_vllm():
    assert [percentile_label(p) for p in (50, 99.0, 99.9)] == ["50", "99", "99.9"]


def test_failed_and_aborted_requests_are_not_completed(make_request, make_failed, make_result):
    requests = [
        make_request(0, prompt_len=10, output_len=4, status=RequestStatus.FINISHED_STOPPED),
        make_request(1, prompt_len=20, output_len=6),
        make_failed(2, prompt_len=40),
        make_request(3, prompt_len=80, output_len=3, status=RequestStatus.FINISHED_ABORTED),
    ]
    summary = summarize(make_result(requests))
    assert (summary["completed"], summary["failed"]) == (2, 2)
    assert (summary["total_input_tokens"], summary["total_output_tokens"]) == (30, 10)


def test_throughputs_divide_by_duration(make_request, make_result):
    requests = [make_request(i, prompt_len=100, output_len=20) for i in range(4)]
    summary = summarize(make_result(requests, duration_s=8.0))
    assert summary["duration"] == 8.0
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_throughput"] == pytest.approx(10.0)
    assert summary["total_token_throughput"] == pytest.approx(60.0)


def test_metrics_without_completed_requests_are_zero(make_failed, make_result):
    summary = summarize(make_result([make_failed(0)]), percentile_metrics=ALL)
    latency = {k: v for k, v in summary.items() if k.endswith("_ms")}
    assert len(latency) == 4 * 4
    assert set(latency.values()) == {0.0}


def test_zero_duration_gives_zero_rates(make_request, make_result):
    summary = summarize(make_result([make_request(0)], duration_s=0.0))
    assert summary["request_throughput"] == 0.0
    assert summary["output_throughput"] == 0.0


def test_unselected_metrics_have_no_keys(make_request, make_result):
    summary = summarize(make_result([make_request(0)]), percentile_metrics=("ttft",))
    assert "mean_ttft_ms" in summary
    assert not any(k.endswith(("_tpot_ms", "_itl_ms", "_e2el_ms")) for k in summary)


def test_bench_keys_come_in_vllm_order(make_request, make_result):
    summary = summarize(make_result([make_request(0)]), goodput_slos={"ttft": 1})
    assert list(summary)[:9] == [
        "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
        "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    ]  # fmt: skip
    assert list(summary)[9:13] == ["mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms"]


def test_goodput_counts_requests_meeting_every_slo(make_request, make_result):
    requests = [
        make_request(0, first_token_s=0.1, finish_s=0.5, output_len=5),  # ttft 100, tpot 100
        make_request(1, first_token_s=0.3, finish_s=0.7, output_len=5),  # ttft 300: misses ttft
        make_request(2, first_token_s=0.1, finish_s=2.1, output_len=5),  # tpot 500: misses tpot
        make_request(3, first_token_s=0.2, finish_s=0.2, output_len=1),  # one token: tpot 0
    ]
    summary = summarize(
        make_result(requests, duration_s=2.0), goodput_slos={"ttft": 200.0, "tpot": 100.0}
    )
    assert summary["request_goodput"] == pytest.approx(1.0)


def test_goodput_e2el_slo_is_inclusive(make_request, make_result):
    requests = [make_request(0, arrival_s=0.0, finish_s=0.5), make_request(1, finish_s=0.75)]
    summary = summarize(make_result(requests, duration_s=1.0), goodput_slos={"e2el": 500.0})
    assert summary["request_goodput"] == pytest.approx(1.0)


def test_goodput_is_null_without_slos_as_in_vllm(make_request, make_result):
    summary = summarize(make_result([make_request(0)]))
    assert "request_goodput" in summary and summary["request_goodput"] is None


def test_unknown_percentile_metric_is_a_user_error(make_request, make_result):
    with pytest.raises(KvlabError, match="ttfb"):
        summarize(make_result([make_request(0)]), percentile_metrics=("ttfb",))


def test_out_of_range_percentile_is_a_user_error(make_request, make_result):
    with pytest.raises(KvlabError, match="101"):
        summarize(make_result([make_request(0)]), metric_percentiles=(101,))


def test_parse_goodput_reads_key_colon_milliseconds():
    assert parse_goodput(["ttft:500", "tpot:50.5"]) == {"ttft": 500.0, "tpot": 50.5}


@pytest.mark.parametrize("item", ["ttft=500", "ttft:fast", "itl:5", "tpot:-1"])
def test_parse_goodput_rejects_bad_items(item):
    with pytest.raises(KvlabError, match="goodput"):
        parse_goodput([item])


def test_parse_percentile_flags():
    assert parse_percentile_metrics("ttft, e2el") == ("ttft", "e2el")
    assert parse_metric_percentiles("50,99.9") == (50.0, 99.9)
    with pytest.raises(KvlabError, match="metric_percentiles"):
        parse_metric_percentiles("50,p99")


def test_metadata_keys_are_always_present(make_request, make_result):
    result = make_result([make_request(0)], metadata={"policy": "paged:block=16", "seed": 3})
    summary = summarize(result)
    assert summary["policy"] == "paged:block=16"
    assert summary["seed"] == 3
    assert summary["model"] is None


def test_unbounded_request_rate_is_saved_as_inf_string(make_request, make_result):
    result = make_result([make_request(0)], metadata={"request_rate": float("inf")})
    assert summarize(result)["request_rate"] == "inf"


def test_summary_is_strict_json(make_request, make_result):
    result = make_result([make_request(0)], metadata={"seed": np.int64(7)})
    summary = summarize(result, percentile_metrics=ALL, goodput_slos={"ttft": 1})
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary


latencies = st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=30)


@given(ttfts=latencies)
def test_percentiles_never_decrease_with_p(make_request, make_result, ttfts):
    requests = [make_request(i, first_token_s=t, finish_s=t + 1.0) for i, t in enumerate(ttfts)]
    summary = summarize(make_result(requests), metric_percentiles=(10, 50, 90, 99, 100))
    values = [summary[f"p{p}_ttft_ms"] for p in (10, 50, 90, 99, 100)]
    assert values == sorted(values)
    assert math.isclose(values[-1], max(ttfts) * 1000, rel_tol=1e-9)
