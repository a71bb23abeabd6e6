"""Attention over mixed-precision block tables (kvkernels/mixed_attention.py): per-level
segments combined by log-sum-exp equal attention over the pages' dequantized values."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from mixed_cases import batch_meta, dense, draw_batch, make_levels

from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.mixed_attention import (
    LevelPages,
    MixedBackend,
    MixedLayer,
    MixedState,
    combine_segments,
    mixed_kernel,
    mixed_paged_attention,
)

HEAD_DIM, KV_HEADS, HEADS, PAGE, NUM_PAGES = 16, 2, 4, 4, 24


def _levels(seed: int) -> list[LevelPages]:
    """Three levels of random content (float32, fp8, int4), every page id at each."""
    return make_levels(seed, NUM_PAGES, PAGE, KV_HEADS, HEAD_DIM)


@st.composite
def batches(draw):
    seqs, tables, page_levels = draw_batch(draw, 4, NUM_PAGES, PAGE)
    return seqs, tables, page_levels, draw(st.integers(0, 3))


@given(batch=batches())
def test_segments_by_level_equal_attention_over_the_dequantized_pages(batch):
    seqs, tables, page_levels, seed = batch
    levels = _levels(seed)
    page_levels = torch.tensor(page_levels, dtype=torch.int8)
    meta = batch_meta(seqs, tables, PAGE)
    query = torch.randn(meta.num_tokens, HEADS, HEAD_DIM,
                        generator=torch.Generator().manual_seed(seed + 7))
    got = mixed_paged_attention(query, levels, page_levels, meta, scale=HEAD_DIM**-0.5,
                                num_kv_heads=KV_HEADS)
    k, v = dense(levels, page_levels)
    want = get_backend("torch").paged_attention(query, k, v, meta, scale=HEAD_DIM**-0.5,
                                                num_kv_heads=KV_HEADS)
    error = (got - want).abs().max() / want.abs().max()
    assert error < 1e-5


def test_a_page_read_at_another_level_changes_the_output():
    levels = _levels(0)
    meta = AttentionMetadata.build(block_tables=[[0, 1, 2]], seq_lens=[12], query_lens=[1],
                                   page_size=PAGE)
    query = torch.randn(1, HEADS, HEAD_DIM)
    demoted = torch.tensor([0, 2, 1] + [0] * (NUM_PAGES - 3), dtype=torch.int8)
    k, v = dense(levels, demoted)
    want = get_backend("torch").paged_attention(query, k, v, meta, scale=1.0,
                                                num_kv_heads=KV_HEADS)
    wrong = demoted.clone()
    wrong[1] = 0  # page 1 read at its old precision
    got = mixed_paged_attention(query, levels, wrong, meta, scale=1.0, num_kv_heads=KV_HEADS)
    assert (got - want).abs().max() > 1e-3


def test_combining_one_segment_is_that_segment():
    out = torch.randn(3, 2, 4)
    lse = torch.randn(3, 2)
    assert torch.equal(combine_segments([(out, lse)]), out)
    # a segment no row sees weighs nothing
    empty = (torch.full_like(out, 5.0), torch.full_like(lse, float("-inf")))
    assert torch.allclose(combine_segments([(out, lse), empty]), out)


def test_the_mixed_backend_takes_the_base_kernel_until_a_page_is_demoted():
    levels = _levels(1)
    state = MixedState(torch.zeros(NUM_PAGES, dtype=torch.int8))
    layer = MixedLayer(levels, state)
    backend = MixedBackend(get_backend("torch"))
    meta = AttentionMetadata.build(block_tables=[[3, 4]], seq_lens=[6], query_lens=[6],
                                   page_size=PAGE)
    query = torch.randn(6, HEADS, HEAD_DIM)
    base = get_backend("torch").paged_attention(query, levels[0].k_cache, levels[0].v_cache,
                                                meta, scale=0.5, num_kv_heads=KV_HEADS)
    plain = backend.paged_attention(query, levels[0].k_cache, levels[0].v_cache, meta,
                                    scale=0.5, num_kv_heads=KV_HEADS, kv_quant=layer)
    assert torch.equal(plain, base)
    state.any_demoted = True  # the same levels (all 0) through the segments
    mixed = backend.paged_attention(query, levels[0].k_cache, levels[0].v_cache, meta,
                                    scale=0.5, num_kv_heads=KV_HEADS, kv_quant=layer)
    assert (mixed - base).abs().max() / base.abs().max() < 1e-5


def test_the_torch_backend_attends_by_the_segments():
    assert mixed_kernel(get_backend("torch")) is mixed_paged_attention
