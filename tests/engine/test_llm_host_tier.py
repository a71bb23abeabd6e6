"""The engine's host tier: prefix pages evicted from the device are copied to host memory and
copied back on a hit, bit-exactly, so greedy tokens are the same with and without the tier."""

from __future__ import annotations

import pytest
import torch

from kvlab.engine import LLM, SamplingParams
from kvlab.errors import KvlabError
from kvlab.policies.outputs import TierBatch
from tests.devices import DEVICES

PAGE = 4
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Three families of 24-token prompts, repeated: the device holds about one prompt's pages, so
# a repeat finds its prefix only in the host tier.
PROMPTS = [[3 + family * 50 + i for i in range(24)] for family in (0, 1, 2)] * 3
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _generate(**settings):
    llm = LLM("tiny-llama", policy=f"paged:block_size={PAGE}", num_gpu_blocks_override=12,
              max_num_seqs=1, verbose=False, **settings)
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return llm.engine, [output.outputs[0].token_ids for output in outputs]


@pytest.mark.parametrize("device", DEVICES)
def test_hits_served_from_the_host_tier_give_the_same_greedy_tokens(device):
    _, plain = _generate(device=device)
    engine, tiered = _generate(kv_tiers="host:64p", device=device)
    assert tiered == plain
    host = engine.manager.tiers[0]
    assert host.stats.num_hits >= 6 * 5  # six repeats, five full prompt pages each
    assert engine.manager.num_prefix_hits < host.stats.num_hits  # mostly from the tier
    engine.manager.check_tiers()  # every tier page holds one key, none left pinned
    assert host.num_used_pages <= host.num_total_pages == 64


def test_write_through_gives_the_same_tokens_too():
    _, plain = _generate()
    from kvlab.policies.tiers import TiersConfig, parse_tiers

    tiers = TiersConfig(parse_tiers("host:64p"), write_policy="write-through")
    engine, tiered = _generate(kv_tiers=tiers)
    assert engine.manager.tiers[0].stats.num_hits > 0
    assert tiered == plain


@pytest.mark.parametrize("write_policy", ["write-through", "write-back"])
def test_tier_pages_of_several_device_pages_give_the_same_tokens_too(write_policy):
    _, plain = _generate()
    from kvlab.policies.tiers import TiersConfig, parse_tiers

    # tier pages of two device pages (vLLM's offloaded block_size): 32 of them in 64 slots;
    # written back, each unit's pages are copied last one first (as the device evicts them)
    tiers = TiersConfig(parse_tiers("host:64p"), write_policy=write_policy,
                        block_size=2 * PAGE)
    engine, tiered = _generate(kv_tiers=tiers)
    host = engine.manager.tiers[0]
    assert host.num_total_pages == 32 and engine.kv_cache.num_tier_pages == 64
    assert host.stats.num_hits >= 6 * 4  # six repeats, two whole tier pages each
    assert tiered == plain
    engine.manager.check_tiers()


@pytest.mark.parametrize("device", DEVICES)
def test_a_page_round_trips_through_the_host_tier_bit_exactly(device):
    llm = LLM("tiny-llama", device=device, policy=f"paged:block_size={PAGE}",
              num_gpu_blocks_override=8, kv_tiers="host:8p", verbose=False)
    cache = llm.engine.kv_cache
    # the tier lies in host memory, page-locked where a GPU copies from it
    assert all(t.device.type == "cpu" for t in cache.tier_k_caches + cache.tier_v_caches)
    assert all(t.is_pinned() == (device == "cuda") for t in cache.tier_k_caches)
    for k_cache, v_cache in zip(cache.k_caches, cache.v_caches, strict=True):
        k_cache.normal_()
        v_cache.normal_()
    before = [t[3].clone() for t in (*cache.k_caches, *cache.v_caches)]
    from kvlab.policies import MemOps

    cache.execute_mem_ops(MemOps(tier_writes=[TierBatch(0, [3], 1, [5])]))
    for t in (*cache.k_caches, *cache.v_caches):
        t[3].fill_(float("nan"))
    cache.execute_mem_ops(MemOps(tier_loads=[TierBatch(1, [5], 0, [3])]))
    after = [t[3] for t in (*cache.k_caches, *cache.v_caches)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_tier_writes_to_one_page_keep_the_last():
    llm = LLM("tiny-llama", policy=f"paged:block_size={PAGE}", num_gpu_blocks_override=8,
              kv_tiers="host:4p", verbose=False)
    cache = llm.engine.kv_cache
    for index, k_cache in enumerate(cache.k_caches):
        for page in range(8):
            k_cache[page].fill_(page + 10 * index)
    from kvlab.policies import MemOps

    cache.execute_mem_ops(MemOps(tier_writes=[TierBatch(0, [1], 1, [2]),
                                              TierBatch(0, [6], 1, [2])]))
    assert torch.all(cache.tier_k_caches[0][2] == 6)


def test_the_engine_refuses_tiers_it_does_not_run():
    with pytest.raises(KvlabError, match="host tier only, not ssd"):
        LLM("tiny-llama", kv_tiers="host:64p,ssd:1GiB", verbose=False)
