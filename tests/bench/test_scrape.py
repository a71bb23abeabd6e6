"""Reading /metrics pages: vLLM's series summed over label sets, errors that name the URL."""

from __future__ import annotations

import pytest

from kvlab.bench import parse_metrics, scrape_metrics
from kvlab.errors import KvlabError
from tests.bench.metrics_server import VLLM_METRICS, serve_text


def test_series_are_summed_over_label_sets_and_buckets_left_out():
    sample = parse_metrics(VLLM_METRICS, time_s=5.0)
    assert sample.time_s == 5.0
    assert sample.get("vllm:num_requests_running") == 5.0
    assert sample.get("vllm:num_preemptions_total") == 4.0
    assert sample.get("vllm:time_to_first_token_seconds_sum") == 1.5
    assert not any(name.endswith("_bucket") for name in sample.values)
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
