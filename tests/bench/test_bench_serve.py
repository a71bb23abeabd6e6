"""`kvlab bench serve` against a live `kvlab serve` on a cache small enough to preempt: every
request's streamed tokens are the offline engine's, the server's preemptions and memory reach
the report, the saved result reads back to the same summary, the concurrency cap holds, and
bad input is one clear line."""

from __future__ import annotations

import json
import math

import pytest

from kvlab.bench import (
    ClientConfig,
    bench_serve,
    load_bench_result,
    preemptions_per_request,
    resolve_model,
)
from kvlab.bench.observed import server_latency_summary
from kvlab.bench.records import BenchRequest
from kvlab.bench.result import peaks
from kvlab.bench.result_files import save_bench_result
from kvlab.cli import main
from kvlab.cli.report import format_report
from kvlab.engine import LLM, SamplingParams
from kvlab.engine.config import EngineConfig
from kvlab.errors import KvlabError
from kvlab.policies import RequestStatus
from kvlab.policies.serving import ServingConfig
from kvlab.traces import load_trace, synthesize_prompt_ids
from tests.live_server import start_live_server

POLICY = "paged:block_size=4,eviction=lru"
NUM_PAGES = 40
VLLM_KEYS = ("date", "duration", "completed", "failed", "total_input_tokens",
             "total_output_tokens", "request_throughput", "request_goodput",
             "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
             "max_concurrent_requests", "label", "model_id", "tokenizer_id", "num_prompts",
             "request_rate", "burstiness", "max_concurrency", "mean_ttft_ms", "p99_itl_ms",
             "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
             "generated_texts", "errors")


def _engine(**serving: object) -> EngineConfig:
    return EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        POLICY, num_gpu_blocks_override=NUM_PAGES, max_model_len=128, **serving))


@pytest.fixture(scope="module")
def live():
    server = start_live_server(_engine())
    yield server
    server.stop()


def _trace(num_prompts: int = 24, input_len: int = 40, output_len: int = 24):
    return load_trace("random", None, num_prompts=num_prompts, seed=3,
                      random_input_len=input_len, random_output_len=output_len,
                      random_range_ratio=0.5)


def _client(live, **options: object) -> ClientConfig:
    return ClientConfig(base_url=live.base_url, model=live.model_name, ignore_eos=True,
                        scrape_interval_s=0.05, **options)


def test_streamed_tokens_equal_the_offline_engine_and_preemptions_are_read(live):
    trace = _trace()
    card = resolve_model(live.base_url, None, None)
    before = live.service.engine.scheduler.num_preemptions
    result = bench_serve(trace, _client(live), card=card, vocab_size=card["vocab_size"], seed=1)
    summary = result.summary()

    assert summary["completed"] == len(trace) and summary["failed"] == 0
    assert summary["total_output_tokens"] == sum(r.output_len for r in trace.requests)
    offline = LLM(_engine().model, policy=POLICY, num_gpu_blocks_override=200,
                  max_model_len=128)
    prompts = synthesize_prompt_ids(trace, card["vocab_size"], 1).requests
    expected = offline.generate([list(r.prompt_token_ids) for r in prompts],
                                [SamplingParams(temperature=0, max_tokens=r.output_len,
                                                ignore_eos=True) for r in prompts])
    for record, output in zip(result.requests, expected, strict=True):
        assert record.output_token_ids == output.outputs[0].token_ids
        assert sum(record.chunk_tokens) == record.num_output_tokens
        assert record.ttft_s is not None and record.ttft_s > 0
    preempted = live.service.engine.scheduler.num_preemptions - before
    assert preempted > 0, "the workload should preempt on 40 pages"
    assert summary["num_preemptions"] == preempted
    # the server's per-request histogram: every request once, their preemptions in all
    per_request = preemptions_per_request(result.series)
    assert per_request is not None and sum(per_request.values()) == len(trace)
    assert sum(k * n for k, n in per_request.items()) == preempted
    assert summary["num_total_pages"] == NUM_PAGES and summary["page_size"] == 4
    assert 0 < summary["mean_kv_usage_perc"] <= summary["peak_kv_usage_perc"] <= 100
    assert summary["max_concurrent_requests"] >= 1
    assert summary["request_goodput"] is None
    assert "internal_fragmentation_perc" not in summary  # a client cannot see it
    # the server's own view: kvlab serve counts its TTFT from the handler's arrival, its
    # queue time (as vLLM) from when the engine took the request in, at a step's boundary:
    # queue and prefill leave out that wait; the client, sending first, waits longer still
    inside = summary["server_mean_queue_time_ms"] + summary["server_mean_prefill_time_ms"]
    assert 0 < inside <= summary["server_mean_ttft_ms"] + 1e-3
    assert summary["server_mean_ttft_ms"] <= summary["mean_ttft_ms"]
    assert "Server's mean prefill time (ms):" in format_report(summary)


def test_the_servers_latency_is_the_histograms_increase_over_the_run():
    series = {"ttft_sum_total": [0.0, float("nan"), 3.0], "ttft_count_total": [0.0, 1.0, 10.0],
              "queue_time_sum_total": [1.0, 1.5], "queue_time_count_total": [2.0, 12.0],
              "prefill_time_sum_total": [0.0, 0.0], "prefill_time_count_total": [0.0, 0.0]}
    assert server_latency_summary(series) == {
        "server_mean_ttft_ms": pytest.approx(300.0),  # 3 s over 10 first tokens
        "server_mean_queue_time_ms": pytest.approx(50.0),
        "server_mean_prefill_time_ms": None}  # no request counted
    assert set(server_latency_summary({}).values()) == {None}  # a server without them


def test_the_saved_result_reads_back_to_the_same_summary(live, tmp_path):
    code = main(["bench", "serve", "--base-url", live.base_url, "--dataset-name", "random",
                 "--num-prompts", "12", "--random-input-len", "24", "--random-output-len",
                 "12", "--ignore-eos", "--save-result", "--save-detailed", "--result-dir",
                 str(tmp_path), "--label", "loop", "--metadata", "site=test",
                 "--metrics-interval", "0.05", "--disable-tqdm",
                 "--percentile-metrics", "ttft,tpot,itl,e2el"])
    assert code == 0
    (path,) = tmp_path.glob("loop-infqps-tiny-llama-*.json")
    document = json.loads(path.read_text())
    assert all(key in document for key in VLLM_KEYS)
    assert document["site"] == "test" and document["label"] == "loop"
    assert len(document["itls"]) == 12 and document["errors"] == [""] * 12
    assert (tmp_path / path.name.replace(".json", ".metrics.csv")).exists()
    assert (tmp_path / path.name.replace(".json", ".requests.csv")).exists()

    loaded = load_bench_result(path).summary(percentile_metrics=("ttft", "tpot", "itl", "e2el"))
    for key in ("completed", "total_output_tokens", "mean_ttft_ms", "p99_itl_ms",
                "mean_tpot_ms", "mean_e2el_ms", "num_preemptions", "peak_kv_usage_perc",
                "max_output_tokens_per_s", "host_cpu_steal_perc"):
        assert loaded[key] == pytest.approx(document[key], rel=1e-9), key
    # the client host's CPU is sampled with every scrape (Linux: /proc/stat)
    assert 0.0 <= document["host_cpu_steal_perc"] <= 100.0
    assert len(document["kvlab_host_cpu"]["time_s"]) >= 2


def test_the_concurrency_cap_holds(live):
    card = resolve_model(live.base_url, None, None)
    result = bench_serve(_trace(16, 16, 8), _client(live, max_concurrency=2), card=card,
                         vocab_size=card["vocab_size"])
    events = sorted([(r.arrival_s, 1) for r in result.requests]
                    + [(r.finish_s, -1) for r in result.requests])
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak <= 2
    assert result.summary()["completed"] == 16


def test_requests_the_server_refuses_are_failed_with_its_message(live):
    card = resolve_model(live.base_url, None, None)
    trace = _trace(6, 100, 60)  # some exceed max_model_len 128
    result = bench_serve(trace, _client(live), card=card, vocab_size=card["vocab_size"])
    too_long = [r for r in trace.requests if r.input_len + r.output_len > 128]
    assert too_long, "the workload should hold requests longer than the model"
    failed = [r for r in result.requests if not r.completed]
    assert [r.request_id for r in failed] == [r.request_id for r in too_long]
    assert all(r.status is RequestStatus.FINISHED_ERROR for r in failed)
    assert all("maximum context length" in (r.error or "") for r in failed)
    assert result.summary()["failed"] == len(too_long)


@pytest.mark.parametrize(("argv", "message"), [
    (["--base-url", "http://127.0.0.1:9", "--ready-check-timeout-sec", "0"],
     "cannot reach http://127.0.0.1:9/v1/models"),
    (["--base-url", "ftp://x"], "--base-url 'ftp://x': expected an http"),
    (["--max-concurrency", "0"], "--max-concurrency 0: expected 1 or more"),
    (["--metadata", "novalue"], "--metadata 'novalue': expected KEY=VALUE"),
    (["--request-timeout", "0"], "--request-timeout 0: expected a finite number"),
    (["--model", "other"], "model 'other' is not served by"),
])
def test_bad_input_is_one_line_naming_the_flag(live, capsys, argv, message):
    base = [] if "--base-url" in argv else ["--base-url", live.base_url]
    code = main(["bench", "serve", *base, "--dataset-name", "random", "--num-prompts", "2",
                 "--random-input-len", "8", "--random-output-len", "4", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_wait_for_a_server_says_what_it_waits_for_and_all_failed_exits_non_zero(live,
                                                                               capsys):
    code = main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--ready-check-timeout-sec",
                 "1", "--dataset-name", "random", "--num-prompts", "2"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[0].startswith("waiting up to 1 s for a server at http://127.0.0.1:9/v1/models")
    assert err[-1].startswith("kvlab bench: error: cannot reach") and len(err) == 2
    # every request longer than the model's 128 tokens: all fail, and the command says so
    code = main(["bench", "serve", "--base-url", live.base_url, "--dataset-name", "random",
                 "--num-prompts", "2", "--random-input-len", "200", "--random-output-len", "4",
                 "--disable-tqdm"])
    assert code == 1
    assert "every one of the 2 requests failed" in capsys.readouterr().err


def test_a_file_that_is_no_bench_result_is_refused(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"completed": 1}))
    with pytest.raises(KvlabError, match="neither a `kvlab bench serve` result"):
        load_bench_result(plain)
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"format": "kvlab-bench-serve", "completed": 1}))
    with pytest.raises(KvlabError, match="--save-detailed"):
        load_bench_result(short)
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(KvlabError, match="not a JSON result file"):
        load_bench_result(binary)


def test_peaks_count_chunks_and_requests_per_second_as_vllm():
    def record(request_id: int, start: float, chunks: list[float]) -> BenchRequest:
        r = BenchRequest(request_id, 4, len(chunks), start, arrival_s=start)
        r.chunk_times_s, r.chunk_tokens = chunks, [1] * len(chunks)
        r.finish_s, r.status = chunks[-1], RequestStatus.FINISHED_LENGTH
        return r

    requests = [record(0, 0.0, [0.2, 0.4, 0.6, 1.1]), record(1, 0.5, [0.7, 0.9, 2.5]),
                record(2, 3.0, [3.1])]
    assert peaks(requests) == {"max_output_tokens_per_s": 5.0, "max_concurrent_requests": 2}
    assert math.isclose(sum(requests[0].itls_s()), 0.9)


def test_a_demoting_servers_demotions_reach_the_summary(tmp_path):
    """kvlab serve with a precision policy: the bench's summary has the pages it demoted into
    each level during the run (its counters' increase, the simulator's keys) and their rate,
    and a saved result reads them back."""
    server = start_live_server(EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4,precision=age:recent=8,depth=2", num_gpu_blocks_override=80,
        max_model_len=128)))
    try:
        ledger = server.service.engine.manager.precision.ledger
        before = list(ledger.demotions)
        card = resolve_model(server.base_url, None, None)
        result = bench_serve(_trace(num_prompts=8), _client(server), card=card,
                             vocab_size=card["vocab_size"], seed=1)
        demoted = [after - first for after, first in zip(ledger.demotions, before, strict=True)]
    finally:
        server.stop()
    summary = result.summary()
    assert summary["precision_demotions_1_fp8_e4m3"] == demoted[1] > 0
    assert summary["precision_demotions_2_int4_per_token_head"] == demoted[2] > 0
    assert summary["precision_demotions_per_s"] == pytest.approx(
        (demoted[1] + demoted[2]) / result.run.duration_s)
    # its held and cached pages at each level, scraped: their shares over the busy scrapes
    assert summary["precision_levels"] == "auto/fp8_e4m3/int4_per_token_head"
    shares = [summary[f"precision_share_{k}_{d}"] for k, d in
              enumerate(summary["precision_levels"].split("/"))]
    assert sum(shares) == pytest.approx(1.0) and shares[2] > 0
    report = format_report(summary)
    assert "Pages demoted to int4_per_token_head:" in report
    assert "Share at int4_per_token_head:" in report
    path, *_ = save_bench_result(result, summary, result_dir=tmp_path,
                                 result_filename="demoting.json", detailed=True)
    assert load_bench_result(path).summary()["precision_demotions_1_fp8_e4m3"] == demoted[1]
