"""A swap-out then a swap-in, carried out by the engine's executor, restores KV pages exactly."""

from __future__ import annotations

import pytest
import torch

from kvlab.engine import LLM, SamplingParams
from tests.devices import DEVICES

PAGE = 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _token_kv(engine, request) -> list[torch.Tensor]:
    """K and V of every computed token of `request`, layer by layer, gathered via its table."""
    table = torch.tensor(engine.manager.block_table(request))
    num_tokens = request.num_computed_tokens
    out = []
    for cache in (*engine.kv_cache.k_caches, *engine.kv_cache.v_caches):
        pages = cache.index_select(0, table.to(cache.device))
        out.append(pages.reshape(-1, *cache.shape[2:])[:num_tokens].clone())
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_swap_out_then_in_restores_the_kv_pages_bit_exactly(device):
    llm = LLM(
        "tiny-llama",
        device=device,
        policy=f"paged:block_size={PAGE},preemption=swap",
        num_gpu_blocks_override=32,
        verbose=False,
    )
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    request = engine.make_request(list(range(3, 21)), params)  # 18 tokens: a partial last page
    engine.scheduler.add_request(request)
    for _ in range(3):  # the prefill, then two decodes
        output = engine.scheduler.schedule()
        sampled = engine.runner.execute(output, {request.request_id: params})
        engine.scheduler.update(output, sampled)
    before = _token_kv(engine, request)
    old_pages = list(engine.manager.block_table(request))

    engine.kv_cache.execute_mem_ops(engine.manager.swap_out(request))
    for cache in (*engine.kv_cache.k_caches, *engine.kv_cache.v_caches):
        cache.fill_(float("nan"))  # whatever was on the device is gone
    taker = engine.make_request([7] * 4, params)  # takes a freed page first
    engine.manager.allocate(taker, 4)
    swap_in = engine.manager.swap_in(request)
    engine.kv_cache.execute_mem_ops(swap_in)

    assert engine.manager.block_table(request) != old_pages
    assert len(swap_in.swap_ins) == len(old_pages) == -(-request.num_computed_tokens // PAGE)
    after = _token_kv(engine, request)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
