"""The Triton kernel for mixed-precision block tables (kvkernels/triton_mixed.py, run by Triton's
interpreter on CPU) against the torch reference over the pages' dequantized values: float32,
relative error < 1e-5 (issue 48's target), for every mix of levels, level formats, GQA, partial
last pages, decodes and prefill chunks in one batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import run_without_interpreter
from mixed_cases import batch_meta, dense, draw_batch, make_levels

from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.mixed_attention import LevelPages, MixedBackend, MixedLayer, MixedState

PAGE, NUM_PAGES, HEAD_DIM = 4, 24, 16
TOL = 1e-5


def _attention(levels: list[LevelPages], page_levels: torch.Tensor, meta: AttentionMetadata,
               num_heads: int, seed: int = 0, partition_size: int = 512,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the Triton kernel's output, the reference's) for random queries over the batch."""
    from kvlab.kernels.triton_mixed import triton_mixed_attention

    num_kv_heads, head_dim = levels[0].k_cache.shape[2], HEAD_DIM
    query = torch.randn(meta.num_tokens, num_heads, head_dim,
                        generator=torch.Generator().manual_seed(seed + 11))
    scale = head_dim**-0.5
    out = torch.full_like(query, float("nan"))  # every row must be written
    got = triton_mixed_attention(query, levels, page_levels, meta, scale=scale,
                                 num_kv_heads=num_kv_heads, out=out,
                                 partition_size=partition_size)
    k, v = dense(levels, page_levels)
    want = get_backend("torch").paged_attention(query, k, v, meta, scale=scale,
                                                num_kv_heads=num_kv_heads)
    return got, want


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def _meta(seqs: list[tuple[int, int]], page_size: int = PAGE) -> AttentionMetadata:
    """Sequences (seq_len, query_len) over consecutive pages in reverse order."""
    tables, used = [], 0
    for seq_len, _ in seqs:
        n = -(-seq_len // page_size)
        tables.append(list(range(used + n - 1, used - 1, -1)))
        used += n
    return AttentionMetadata.build(block_tables=tables, seq_lens=[s for s, _ in seqs],
                                   query_lens=[q for _, q in seqs], page_size=page_size)


@st.composite
def batches(draw):
    seqs, tables, page_levels = draw_batch(draw, 3, NUM_PAGES, PAGE)
    kv_heads, group = draw(st.sampled_from([(2, 2), (1, 4), (2, 3), (4, 1)]))
    partition_size = draw(st.sampled_from([6, 8, 512]))  # decodes over 1 to 4 partitions
    return seqs, tables, page_levels, kv_heads, group, partition_size, draw(st.integers(0, 3))


@settings(max_examples=25)
@given(batch=batches())
def test_the_kernel_equals_attention_over_the_dequantized_pages(batch):
    seqs, tables, page_levels, kv_heads, group, partition_size, seed = batch
    levels = make_levels(seed, NUM_PAGES, PAGE, kv_heads, HEAD_DIM)
    meta = batch_meta(seqs, tables, PAGE)
    got, want = _attention(levels, torch.tensor(page_levels, dtype=torch.int8), meta,
                           kv_heads * group, seed, partition_size)
    assert _error(got, want) < TOL


@pytest.mark.parametrize("level", [0, 1, 2])
def test_every_page_at_one_level(level):
    """All at the cache's dtype, all demoted once, all demoted twice."""
    levels = make_levels(1, NUM_PAGES, PAGE, 2, HEAD_DIM)
    meta = _meta([(18, 1), (7, 7), (13, 4)])  # partial last pages; a decode, a prefill, a chunk
    page_levels = torch.full((NUM_PAGES,), level, dtype=torch.int8)
    got, want = _attention(levels, page_levels, meta, num_heads=4)
    assert _error(got, want) < TOL


@pytest.mark.parametrize("names", [
    ("bfloat16", "fp8_e4m3"),
    ("fp8_e5m2", "int4_per_token_head"),
    ("int8", "int4_per_token_head"),
    ("int8_per_token_head", "int4_per_token_head"),
    ("fp8_per_token_head",),
])
def test_every_page_format_at_any_level(names):
    levels = make_levels(2, NUM_PAGES, PAGE, 2, HEAD_DIM, names=names)
    page_levels = torch.tensor([i % len(names) for i in range(NUM_PAGES)], dtype=torch.int8)
    got, want = _attention(levels, page_levels, _meta([(21, 1), (15, 6)]), num_heads=4)
    assert _error(got, want) < TOL


@pytest.mark.parametrize("partition_size", [64, 100, 512])
def test_long_contexts_over_several_tiles_and_a_wide_group(partition_size):
    """Contexts past one 64-position tile, decodes over 1 to 3 partitions, 7 query heads a KV
    head (rows packed unevenly)."""
    page_size, num_pages = 16, 22
    levels = make_levels(3, num_pages, page_size, 2, HEAD_DIM)
    page_levels = torch.tensor([(3 * i) % 4 % 3 for i in range(num_pages)], dtype=torch.int8)
    meta = _meta([(150, 1), (130, 40), (17, 1)], page_size=page_size)
    got, want = _attention(levels, page_levels, meta, num_heads=14,
                           partition_size=partition_size)
    assert _error(got, want) < TOL


def test_a_page_read_at_another_level_changes_the_output():
    from kvlab.kernels.triton_mixed import triton_mixed_attention

    levels = make_levels(0, NUM_PAGES, PAGE, 2, HEAD_DIM)
    meta = _meta([(12, 1)])
    page_levels = torch.tensor([0, 2, 1] + [0] * (NUM_PAGES - 3), dtype=torch.int8)
    query = torch.randn(1, 4, HEAD_DIM)
    right = triton_mixed_attention(query, levels, page_levels, meta, scale=1.0, num_kv_heads=2)
    page_levels[1] = 0
    wrong = triton_mixed_attention(query, levels, page_levels, meta, scale=1.0, num_kv_heads=2)
    assert (right - wrong).abs().max() > 1e-3


def test_the_mixed_backend_over_triton_attends_by_the_kernel(monkeypatch):
    from kvlab.kernels import triton_mixed

    calls = []
    kernel = triton_mixed.triton_mixed_attention
    monkeypatch.setattr(triton_mixed, "triton_mixed_attention",
                        lambda *a, **k: calls.append(1) or kernel(*a, **k))
    levels = make_levels(4, NUM_PAGES, PAGE, 2, HEAD_DIM)
    page_levels = torch.tensor([i % 3 for i in range(NUM_PAGES)], dtype=torch.int8)
    layer = MixedLayer(levels, MixedState(page_levels, any_demoted=True))
    meta = _meta([(10, 1), (9, 9)])
    query = torch.randn(meta.num_tokens, 4, HEAD_DIM)
    outputs = [MixedBackend(get_backend(name)).paged_attention(
        query, levels[0].k_cache, levels[0].v_cache, meta, scale=0.25, num_kv_heads=2,
        kv_quant=layer) for name in ("triton", "torch")]
    assert calls == [1]
    assert _error(*outputs) < TOL


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_compiled_kernel_on_cuda_matches_the_reference():
    result = run_without_interpreter("triton_mixed_cuda_check.py")
    assert result.returncode == 0, result.stdout + result.stderr
