"""Reading /metrics pages: vLLM's series summed over label sets, errors that name the URL."""

from __future__ import annotations

import pytest

from kvlab.bench import metrics_series, parse_metrics, preemptions_per_request, scrape_metrics
from kvlab.errors import KvlabError
from tests.bench.metrics_server import VLLM_METRICS, serve_http, serve_text


def test_series_are_summed_over_label_sets_and_buckets_left_out():
    sample = parse_metrics(VLLM_METRICS, time_s=5.0)
    assert sample.time_s == 5.0
    assert sample.get("vllm:num_requests_running") == 5.0
    assert sample.get("vllm:num_preemptions_total") == 4.0
    assert sample.get("vllm:time_to_first_token_seconds_sum") == 1.5
    assert not any(name.endswith("_bucket") for name in sample.values)  # but KEPT_BUCKETS
    assert sample.get("kvlab:kv_pages_used", -1.0) == -1.0  # not exported by vLLM


def test_a_page_is_scraped_over_http():
    url, stop = serve_text(lambda: VLLM_METRICS)
    try:
        assert scrape_metrics(url).get("vllm:kv_cache_usage_perc") == 0.25
    finally:
        stop()


@pytest.mark.parametrize(("url", "message"), [
    ("localhost:1/metrics", "expected an http:// or https:// URL"),
    ("http://127.0.0.1:1/metrics", "cannot read http://127.0.0.1:1/metrics"),
])
def test_a_bad_or_unreachable_url_is_a_user_error(url, message):
    with pytest.raises(KvlabError, match=message):
        scrape_metrics(url, timeout_s=2)


def test_a_page_that_is_not_prometheus_text_is_a_user_error():
    url, stop = serve_text(lambda: "<html>{not metrics}</html>")
    try:
        with pytest.raises(KvlabError, match="not a Prometheus metrics page"):
            scrape_metrics(url)
    finally:
        stop()


def _preemption_page(buckets: dict[str, int], total: int) -> str:
    lines = ["# TYPE vllm:request_num_preemptions histogram"]
    lines += [f'vllm:request_num_preemptions_bucket{{le="{le}",model_name="m"}} {n}'
              for le, n in buckets.items()]
    count = buckets["+Inf"]
    lines += [f'vllm:request_num_preemptions_count{{model_name="m"}} {count}',
              f'vllm:request_num_preemptions_sum{{model_name="m"}} {total}']
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("buckets, total, expected", [
    # vLLM's buckets: le 1 holds 0 and 1, told apart by the sum (3 ones, 2 twos, 1 five)
    ({"1.0": 10, "2.0": 12, "3.0": 12, "4.0": 12, "5.0": 13, "10.0": 13, "20.0": 13,
      "+Inf": 13}, 3 + 4 + 5, {0: 7, 1: 3, 2: 2, 5: 1}),
    # kvlab serve's, with le 0: exact even with a request preempted 7 times
    ({"0.0": 4, "1.0": 6, "2.0": 6, "3.0": 6, "4.0": 6, "5.0": 6, "10.0": 7, "20.0": 7,
      "+Inf": 7}, 2 + 7, {0: 4, 1: 2, 6: 1}),
])
def test_preemptions_per_request_from_the_servers_histogram(buckets, total, expected):
    empty = {le: 0 for le in buckets}
    samples = [parse_metrics(_preemption_page(empty, 0), 0.0),
               parse_metrics(_preemption_page(buckets, total), 1.0)]
    assert preemptions_per_request(metrics_series(samples, 0.0)) == expected


def test_a_server_without_the_histogram_has_no_per_request_counts():
    series = metrics_series([parse_metrics(VLLM_METRICS, 0.0)] * 2, 0.0)
    assert preemptions_per_request(series) is None


def test_a_long_error_body_gives_its_message_not_a_cut_json():
    # vLLM's 400 for a long prompt is a JSON body of over 300 characters
    import json

    from kvlab.bench import ClientConfig, PlannedRequest, run_client

    message = "This model's maximum context length is 2048 tokens. " + "x" * 400
    body = json.dumps({"error": {"message": message, "type": "BadRequestError",
                                 "param": "input_tokens", "code": 400}}).encode()
    url, stop = serve_http(lambda method, path: (400, "application/json", body))
    try:
        config = ClientConfig(base_url=url, model="m", metrics_path=None)
        ran = run_client(config, [PlannedRequest(0, [1, 2, 3], 3, 4, 0.0)])
    finally:
        stop()
    error = ran.requests[0].error
    assert error.startswith("HTTP 400: This model's maximum context length is 2048 tokens.")
    assert '{"error"' not in error and len(error) <= 320


def test_the_precision_mix_is_kept_by_level_and_dtype():
    """kvlab serve's pages at each precision: summed under the name, and kept by level and
    dtype (the Live page's precision chart, a benchmark's shares) over the model label."""
    page = """\
# HELP kvlab:kv_pages_at_precision KV pages held or cached at each precision level.
# TYPE kvlab:kv_pages_at_precision gauge
kvlab:kv_pages_at_precision{dtype="auto",level="0",model_name="tiny"} 6.0
kvlab:kv_pages_at_precision{dtype="fp8_e4m3",level="1",model_name="tiny"} 10.0
kvlab:kv_pages_at_precision{dtype="fp8_e4m3",level="1",model_name="other"} 2.0
"""
    sample = parse_metrics(page, time_s=1.0)
    assert sample.get("kvlab:kv_pages_at_precision") == 18.0
    assert sample.get('kvlab:kv_pages_at_precision{level="0",dtype="auto"}') == 6.0
    assert sample.get('kvlab:kv_pages_at_precision{level="1",dtype="fp8_e4m3"}') == 12.0
