"""The engine with the ascend backend (its Triton kernels in the interpreter on CPU) produces the
torch backend's greedy tokens, through swap preemption, prefix caching and dynamic block sizes,
and with an int8 KV cache (C8). `make test-ascend` runs it again under triton-ascend's
interpreter."""

from __future__ import annotations

import pytest
import torch

from kvlab.engine import LLM, SamplingParams
from kvlab.kernels.extents import build_extents

pytest.importorskip("triton")

PROMPTS = [[5, 9, 14, 3, 22, 7, 8, 1, 30] * 3, [5, 9, 14, 3, 22, 7, 8, 1, 30] * 3 + [2, 6], [17, 4]]
MAX_TOKENS = [6, 5, 7]


def _greedy(backend: str, policy: str, num_pages: int, kv_cache_dtype: str = "auto"
            ) -> tuple[list[list[int]], LLM]:
    llm = LLM(
        "tiny-llama",
        policy=policy,
        attention_backend=backend,
        num_gpu_blocks_override=num_pages,
        # small step limits keep the start-up warm-up (a largest prefill and decode batch)
        # small: the interpreter runs every program one after another
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching="eviction=lru" in policy,
        kv_cache_dtype=kv_cache_dtype,
        verbose=False,
    )
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [out.outputs[0].token_ids for out in outputs], llm


@pytest.mark.parametrize(
    ("policy", "num_pages"),
    [
        ("paged:block_size=16,eviction=lru", 32),
        ("paged:block_size=16,preemption=swap", 4),
        ("buddy:block_size=16,block_sizing=geometric", 32),
    ],
)
def test_ascend_backend_keeps_the_torch_backends_greedy_tokens(policy, num_pages, monkeypatch):
    import kvlab.kernels.ascend_backend as ascend

    longest_extent = [0]

    def recording(*args, **kwargs):
        extents = build_extents(*args, **kwargs)
        longest_extent[0] = max(longest_extent[0], int(extents.num_pages.max()))
        return extents

    monkeypatch.setattr(ascend, "build_extents", recording)
    tokens, llm = _greedy("ascend", policy, num_pages)
    assert llm.engine.model.attn_backend.name == "ascend"
    assert tokens == _greedy("torch", policy, num_pages)[0]
    scheduler, manager = llm.engine.scheduler, llm.engine.manager
    if "swap" in policy:
        assert scheduler.num_swaps_out > 0
    if "lru" in policy:
        assert manager.num_prefix_hits > 0
    if "geometric" in policy:
        assert longest_extent[0] >= 2  # runs of 2^k pages read as one extent


def test_ascend_int8_kv_cache_keeps_the_torch_backends_greedy_tokens_through_swaps():
    # int8 pages of 32 tokens (CANN's multiple), 3 for prompts needing 5: swapped out and in
    policy = "paged:block_size=32,preemption=swap"
    tokens, llm = _greedy("ascend", policy, 3, kv_cache_dtype="int8")
    cache = llm.engine.kv_cache
    assert cache.k_caches[0].dtype == torch.int8 and cache.kv_quants is not None
    assert llm.engine.scheduler.num_swaps_out > 0
    assert tokens == _greedy("torch", policy, 3, kv_cache_dtype="int8")[0]
