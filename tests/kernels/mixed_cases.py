"""Mixed-precision pages for the kernel tests: every page id at each of a few levels, random
content, and the dense float32 cache of each page's dequantized values at its level (the
reference the mixed attention paths are checked against)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from kvlab.kernels import AttentionMetadata
from kvlab.kernels.kv_quant import KVQuant, page_format
from kvlab.kernels.mixed_attention import LevelPages
from kvlab.specs.kv_dtype import kv_cache_dtype

LEVEL_DTYPES = ("auto", "fp8_e4m3", "int4_per_token_head")


def make_levels(seed: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                names: tuple[str, ...] = LEVEL_DTYPES,
                model_dtype: torch.dtype = torch.float32) -> list[LevelPages]:
    """A level per name (`auto`: float pages of `model_dtype`), each page id holding random
    values stored at that level (C8's channel scales random too)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    levels = []
    for name in names:
        k, v = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        dtype = kv_cache_dtype(name)
        if not dtype.is_quantized:
            element, _ = page_format(dtype, head_dim, model_dtype)
            levels.append(LevelPages(k.to(element), v.to(element), None))
            continue
        channel = (torch.rand(num_kv_heads, head_dim, generator=generator) * 0.05 + 0.01
                   if dtype.scales == "per_channel" else None)
        quant = KVQuant(dtype, head_dim, k_channel_scale=channel, v_channel_scale=channel)
        stored = [quant.quantize(x.flatten(0, 1), side).view(num_pages, page_size,
                                                             num_kv_heads, -1)
                  for x, side in ((k, "k"), (v, "v"))]
        levels.append(LevelPages(stored[0], stored[1], quant))
    return levels


def dense(levels: list[LevelPages], page_levels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every page's dequantized K and V at its level, as one float32 cache."""
    num_pages, page_size, num_kv_heads = levels[0].k_cache.shape[:3]
    k0, _ = levels[0].dequantize(torch.tensor([0]))
    k = torch.empty(num_pages, page_size, num_kv_heads, k0.shape[-1])
    v = torch.empty_like(k)
    for page in range(num_pages):
        pk, pv = levels[int(page_levels[page])].dequantize(torch.tensor([page]))
        k[page], v[page] = pk, pv
    return k, v


def draw_batch(draw: Callable[..., Any], max_seqs: int, num_pages: int, page_size: int,
               ) -> tuple[list[tuple[int, int]], list[list[int]], list[int]]:
    """Drawn by a hypothesis strategy: 1 to `max_seqs` sequences as (seq_len, query_len: a
    decode, a whole prefill or half of one), each on its own random pages of `num_pages`
    (block tables), and every page's level (0 to 2)."""
    seqs = []
    for _ in range(draw(st.integers(1, max_seqs))):
        seq_len = draw(st.integers(1, 5 * page_size))
        query_len = draw(st.sampled_from([1, seq_len, max(1, seq_len // 2)]))
        seqs.append((seq_len, query_len))
    pages = draw(st.permutations(range(num_pages)))
    tables, used = [], 0
    for seq_len, _ in seqs:
        n = -(-seq_len // page_size)
        tables.append(list(pages[used : used + n]))
        used += n
    page_levels = draw(st.lists(st.integers(0, 2), min_size=num_pages, max_size=num_pages))
    return seqs, tables, page_levels


def batch_meta(seqs: list[tuple[int, int]], tables: list[list[int]], page_size: int,
               ) -> AttentionMetadata:
    """The metadata of sequences (seq_len, query_len) over their block tables."""
    return AttentionMetadata.build(block_tables=tables, seq_lens=[s for s, _ in seqs],
                                   query_lens=[q for _, q in seqs], page_size=page_size)
