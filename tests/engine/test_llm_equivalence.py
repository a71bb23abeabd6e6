"""kvlab's greedy tokens equal transformers' generate under every policy family (fp32, CPU).

The same random checkpoint (saved by transformers) is generated from by transformers, one prompt
at a time, and by kvlab's LLM as one batch under each memory policy; each case also checks that
its policy really did what it is there to test (preempted, swapped, hit the prefix cache...).
"""

from __future__ import annotations

import pytest
import torch
from engine_hf_models import transformers_greedy

from kvlab.engine import LLM, SamplingParams
from kvlab.engine.costs import MeasuredPreemptionCosts
from tests.devices import DEVICES

PAGE = 4
SHARED_PREFIX = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67]  # 4 pages


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 384, (n,), generator=generator).tolist()

    return [
        ids(3),
        SHARED_PREFIX + ids(9),
        ids(27),
        SHARED_PREFIX + ids(2),
        ids(11),
        ids(40),
        SHARED_PREFIX + ids(21),
        ids(6),
    ]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


PROMPTS = _prompts()
MAX_TOKENS = [9, 6, 12, 10, 7, 12, 8, 11]


def _params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]


@pytest.fixture(scope="module")
def reference(hf_tiny_llama, hf_tiny_qwen2):
    folders = {"llama": hf_tiny_llama, "qwen2": hf_tiny_qwen2}
    return {
        family: (folder, transformers_greedy(folder, PROMPTS, MAX_TOKENS))
        for family, folder in folders.items()
    }


def _generate(folder, policy: str, **kwargs) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(folder), policy=policy, verbose=False, **kwargs)
    outputs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    return llm, [out.outputs[0].token_ids for out in outputs]


FAMILIES = ["llama", "qwen2"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_recompute_preemption_keeps_transformers_tokens(reference, family, device):
    folder, expected = reference[family]
    llm, tokens = _generate(
        folder, f"paged:block_size={PAGE}", num_gpu_blocks_override=16, device=device
    )
    assert tokens == expected
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.scheduler.num_swaps_out == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_swap_preemption_keeps_transformers_tokens(reference, family, device):
    folder, expected = reference[family]
    llm, tokens = _generate(
        folder, f"paged:block_size={PAGE},preemption=swap", num_gpu_blocks_override=16,
        device=device,
    )
    assert tokens == expected
    assert llm.engine.scheduler.num_swaps_out > 0
    assert llm.engine.scheduler.num_swaps_in > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_caching_hits_keep_transformers_tokens(reference, family, device):
    folder, expected = reference[family]
    llm, tokens = _generate(
        folder, f"paged:block_size={PAGE},eviction=lru", num_gpu_blocks_override=128,
        device=device,
    )
    assert tokens == expected
    assert llm.engine.manager.num_prefix_hits >= 2 * len(SHARED_PREFIX) // PAGE


@pytest.mark.parametrize("family", FAMILIES)
def test_contiguous_reservation_keeps_transformers_tokens(reference, family):
    folder, expected = reference[family]
    llm, tokens = _generate(
        folder, f"contiguous:block_size={PAGE}", num_gpu_blocks_override=64, max_model_len=64
    )
    assert tokens == expected
    steps = llm.last_run.steps.columns
    assert max(steps["num_seqs"]) < len(PROMPTS)  # 16-page reservations: 4 requests at a time


@pytest.mark.parametrize("family", FAMILIES)
def test_buddy_with_geometric_blocks_keeps_transformers_tokens(reference, family):
    folder, expected = reference[family]
    llm, tokens = _generate(
        folder, f"buddy:block_size={PAGE},block_sizing=geometric", num_gpu_blocks_override=64
    )
    assert tokens == expected
    tables = [llm.engine.manager.block_table(r) for r in llm.last_run.requests]
    assert tables == [[]] * len(PROMPTS)  # everything was given back


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_with_a_small_token_budget_keeps_transformers_tokens(reference, family):
    folder, expected = reference[family]
    llm, tokens = _generate(
        folder, f"paged:block_size={PAGE}", num_gpu_blocks_override=128, max_num_batched_tokens=8
    )
    assert tokens == expected
    steps = llm.last_run.steps.columns
    assert max(steps["num_prefill_tokens"]) == 8 < max(len(p) for p in PROMPTS)


def test_auto_preemption_swaps_when_the_cost_model_says_so(reference):
    folder, expected = reference["llama"]
    free_swaps = MeasuredPreemptionCosts(0.0, 0.0, 1.0)
    llm, tokens = _generate(
        folder,
        f"paged:block_size={PAGE},preemption=auto",
        num_gpu_blocks_override=16,
        preemption_costs=free_swaps,
    )
    assert tokens == expected
    assert llm.engine.scheduler.num_swaps_out > 0


# One case per member of each policy family, each with a budget small enough to preempt:
# (policy, KV pages). Prefix caching meets preemption in most of them, so a recomputed
# request hits its own prompt and output pages. With 14 pages buddy memory cannot hold the
# 40-token prompt's 16-page block beside anything: alone, it takes its length as runs.
# Policies that reserve a request's whole length up front never grow, so never preempt:
# there memory limits how many requests run at once.
PREEMPTING_FAMILIES = [
    ("paged:block_sizing=fixed,eviction=lru", 16),
    ("paged:block_sizing=geometric,eviction=fifo,preemption=swap", 16),
    ("paged:block_sizing=predicted,eviction=lfu,victim=longest", 16),
    ("buddy:block_sizing=fixed,eviction=lru", 14),
    ("buddy:block_sizing=geometric,eviction=cost,preemption=swap", 18),
    ("buddy:block_sizing=predicted,victim=fewest-pages", 14),
    ("contiguous:reserve=pow2,eviction=lru", 16),
    ("contiguous:reserve=oracle,preemption=swap", 16),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("policy", "num_pages"), PREEMPTING_FAMILIES)
def test_every_policy_family_under_memory_pressure_keeps_transformers_tokens(
    reference, policy, num_pages, device
):
    folder, expected = reference["llama"]
    kind, options = policy.split(":")
    llm, tokens = _generate(
        folder, f"{kind}:block_size={PAGE},{options}", num_gpu_blocks_override=num_pages,
        max_model_len=64, device=device,
    )
    assert tokens == expected
    if "predicted" in policy or kind == "contiguous":
        assert max(llm.last_run.steps.columns["num_seqs"]) <= 2
    else:
        assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.manager.usage().num_used_pages == 0
