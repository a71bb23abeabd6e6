"""The engine with the Triton attention backend (Triton's interpreter on CPU; on a CUDA GPU,
compiled kernels where TRITON_INTERPRET=0) keeps transformers' greedy tokens, through preemption
and prefix caching."""

from __future__ import annotations

import pytest
from engine_hf_models import transformers_greedy

from kvlab.engine import LLM, SamplingParams
from tests.devices import DEVICES

pytest.importorskip("triton")

PROMPTS = [[5, 9, 14, 3, 22, 7, 8, 1, 30], [5, 9, 14, 3, 22, 7, 8, 1, 44, 2, 6], [17, 4]]
MAX_TOKENS = [5, 4, 6]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("policy", "num_pages"),
    [("paged:block_size=4,eviction=lru", 64), ("paged:block_size=4,preemption=swap", 6)],
)
def test_triton_backend_keeps_transformers_tokens(hf_tiny_llama, policy, num_pages, device):
    expected = transformers_greedy(hf_tiny_llama, PROMPTS, MAX_TOKENS)
    llm = LLM(
        str(hf_tiny_llama),
        device=device,
        policy=policy,
        attention_backend="triton",
        num_gpu_blocks_override=num_pages,
        verbose=False,
    )
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    assert llm.engine.model.attn_backend.name == "triton"
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected
    scheduler, manager = llm.engine.scheduler, llm.engine.manager
    if "swap" in policy:
        assert scheduler.num_swaps_out > 0
    else:
        assert manager.num_prefix_hits > 0
