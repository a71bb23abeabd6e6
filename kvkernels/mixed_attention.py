"""Attention over block tables whose pages have different precisions (mixed-precision paging,
policies/precision/): one segment per precision level, combined exactly by log-sum-exp.

A page id has a slot in every level's page tensors (`LevelPages`: that level's K and V pages
and its KVQuant, None for float pages); `page_levels[page]` says which one holds its content.
For each query row, each level's segment is the keys of the pages at that level that the row
may see: attention over a segment gives an output o_l and the log of its softmax denominator
lse_l (-inf where the row sees no key of the segment), and the row's output is
sum_l exp(lse_l - lse) o_l with lse = logsumexp_l lse_l, as split attention combines partial
results. Everything is computed in float32 from the dequantized values, so the result equals
attention over one dense tensor of the pages' dequantized values up to float32 rounding.

`MixedBackend` puts it behind the kernel backend protocol the model calls: a layer's cache
item is a `MixedLayer`, writes go to level 0 (new tokens are stored at the cache's dtype), and
attention takes the backend's own kernel while no page is demoted. Once one is, the Triton
backend attends by its own kernel (kvkernels/triton_mixed.py: one pass over all levels, no
segments); every other backend by the torch segments here, the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from kvlab.kernels.metadata import AttentionMetadata
from kvlab.kernels.torch_backend import attend

if TYPE_CHECKING:
    from kvlab.kernels.kv_quant import KVQuant


@dataclass(frozen=True, slots=True, eq=False)
class LevelPages:
    """One precision level's pages of one layer: `[num_page_ids, page_size, num_kv_heads,
    last]` each, stored by `kv_quant` (None: float pages of the model's dtype)."""

    k_cache: Tensor
    v_cache: Tensor
    kv_quant: KVQuant | None

    def dequantize(self, pages: Tensor) -> tuple[Tensor, Tensor]:
        """float32 K and V `[len(pages) * page_size, num_kv_heads, head_dim]` of `pages`."""
        k = self.k_cache.index_select(0, pages)
        v = self.v_cache.index_select(0, pages)
        quant = self.kv_quant
        if quant is not None:
            k, v = quant.dequantize(k, "k"), quant.dequantize(v, "v")
        return k.float().flatten(0, 1), v.float().flatten(0, 1)

    def store(self, pages: Tensor, k: Tensor, v: Tensor) -> None:
        """Write float K and V `[len(pages), page_size, num_kv_heads, head_dim]` into `pages`
        at this level (quantized by its KVQuant, else cast)."""
        for rows, cache, side in ((k, self.k_cache, "k"), (v, self.v_cache, "v")):
            quant = self.kv_quant
            flat = rows.flatten(0, 1)
            stored = flat.to(cache.dtype) if quant is None else quant.quantize(flat, side)
            cache.index_copy_(0, pages, stored.view(len(pages), *cache.shape[1:]))


@dataclass(slots=True)
class MixedState:
    """What every layer shares: each page id's level (int8 on the cache's device) and whether
    any page is demoted (False: the backend's own kernel, unchanged)."""

    page_levels: Tensor
    any_demoted: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class MixedLayer:
    """A layer's pages at every level (level 0 first: the cache's dtype) and the shared
    state: the third item of the layer's cache, as the model passes a KVQuant."""

    levels: Sequence[LevelPages]
    state: MixedState = field(repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class MixedBackend:
    """A kernel backend's `write_kv` and `paged_attention` for layers given as `MixedLayer`s:
    writes at level 0, attention over the levels once a page is demoted (`mixed_kernel`)."""

    base: Any

    def write_kv(self, key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor,
                 slot_mapping: Tensor, kv_quant: MixedLayer | None = None) -> None:
        """New tokens' K and V into level 0 (the cache's dtype), by the base backend."""
        assert kv_quant is not None, "a mixed-precision cache passes its MixedLayer"
        level = kv_quant.levels[0]
        extra = {} if level.kv_quant is None else {"kv_quant": level.kv_quant}
        self.base.write_kv(key, value, level.k_cache, level.v_cache, slot_mapping, **extra)

    def paged_attention(self, query: Tensor, k_cache: Tensor, v_cache: Tensor,
                        meta: AttentionMetadata, *, scale: float, num_kv_heads: int,
                        out: Tensor | None = None, sliding_window: int = 0,
                        kv_quant: MixedLayer | None = None) -> Tensor:
        """Attention over the layer's pages at their levels."""
        assert kv_quant is not None, "a mixed-precision cache passes its MixedLayer"
        assert sliding_window == 0, "mixed precision runs full-attention models only"
        level = kv_quant.levels[0]
        if not kv_quant.state.any_demoted:
            extra = {} if level.kv_quant is None else {"kv_quant": level.kv_quant}
            return self.base.paged_attention(query, level.k_cache, level.v_cache, meta,
                                             scale=scale, num_kv_heads=num_kv_heads, out=out,
                                             **extra)
        attend = mixed_kernel(self.base)
        return attend(query, kv_quant.levels, kv_quant.state.page_levels, meta, scale=scale,
                      num_kv_heads=num_kv_heads, out=out)


def mixed_kernel(base: Any) -> Callable[..., Tensor]:
    """Attention over mixed-precision pages for the kernel backend `base`: the Triton kernel
    (kvkernels/triton_mixed.py) under the Triton backend, else `mixed_paged_attention`."""
    if getattr(base, "name", None) == "triton":
        # (imported here: the torch backend's runs never import triton)
        from kvlab.kernels.triton_mixed import triton_mixed_attention

        return partial(triton_mixed_attention, partition_size=base.partition_size)
    return mixed_paged_attention


def mixed_paged_attention(query: Tensor, levels: Sequence[LevelPages], page_levels: Tensor,
                          meta: AttentionMetadata, *, scale: float, num_kv_heads: int,
                          out: Tensor | None = None) -> Tensor:
    """Causal attention of query `[num_tokens, num_heads, head_dim]` over each sequence's
    pages, page p read from `levels[page_levels[p]]`: one segment per level, combined by
    log-sum-exp (the module's docstring). Float32 compute, cast to the query's dtype."""
    out = torch.empty_like(query) if out is None else out
    page_size = meta.page_size
    starts = meta.query_start_loc_cpu
    for seq_id, (seq_len, query_len) in enumerate(zip(meta.seq_lens_cpu, meta.query_lens_cpu,
                                                      strict=True)):
        if query_len == 0:
            continue
        start = starts[seq_id]
        num_pages = -(-seq_len // page_size)
        pages = meta.block_tables[seq_id, :num_pages].to(torch.int64)
        q = query[start : start + query_len].float()  # [q_len, heads, dim]
        q_pos = torch.arange(seq_len - query_len, seq_len, device=query.device)
        seq_levels = page_levels.index_select(0, pages)
        if bool((seq_levels == seq_levels[0]).all()):  # (one level: a prompt's own pages)
            level_pages = levels[int(seq_levels[0])]
            out[start : start + query_len] = _one_level(
                q, q_pos, level_pages, pages, seq_len, scale).to(out.dtype)
            continue
        parts = []
        for level, level_pages in enumerate(levels):
            at_level = (seq_levels == level).nonzero().flatten()
            if at_level.numel():
                parts.append(_segment(q, q_pos, level_pages, pages, at_level, seq_len,
                                      page_size, scale, num_kv_heads))
        out[start : start + query_len] = combine_segments(parts).to(out.dtype)
    return out


def _one_level(q: Tensor, q_pos: Tensor, level: LevelPages, pages: Tensor, seq_len: int,
               scale: float) -> Tensor:
    """Output `[q_len, heads, dim]` of `q` over a sequence whose `pages` are all at `level`:
    one segment, so no log-sum-exp to combine, and the torch backend's fused attention
    (`attend`, float32) instead of the segments' scores written out (a long prompt's
    prefill: 1,315 tokens took 0.54 s on the segments' path against 0.07 s without
    demotion)."""
    k, v = level.dequantize(pages)  # [n * page, kv_heads, dim]: the keys in position order
    k, v = k[:seq_len], v[:seq_len]  # (a page's unwritten tail: never read)
    seen = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]  # causal
    o = attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
               seen, scale)
    return o[0].transpose(0, 1)


def _segment(q: Tensor, q_pos: Tensor, level: LevelPages, pages: Tensor, columns: Tensor,
             seq_len: int, page_size: int, scale: float, num_kv_heads: int,
             ) -> tuple[Tensor, Tensor]:
    """(output [q_len, heads, dim], lse [q_len, heads]) of `q` over the keys of the block
    table's `columns` (pages read at `level`), causal, slots past `seq_len` masked."""
    k, v = level.dequantize(pages.index_select(0, columns))  # [n * page, kv_heads, dim]
    k_pos = (columns[:, None] * page_size
             + torch.arange(page_size, device=columns.device)).flatten()
    group = q.shape[1] // num_kv_heads
    k = k.repeat_interleave(group, dim=1)  # [keys, heads, dim]
    v = v.repeat_interleave(group, dim=1)
    seen = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < seq_len)  # [q_len, keys]
    # masked slots may hold anything (a page's unwritten tail): no 0 * inf
    k = k.masked_fill(~(k_pos < seq_len)[:, None, None], 0.0)
    v = v.masked_fill(~(k_pos < seq_len)[:, None, None], 0.0)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~seen[None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [heads, q_len]; -inf where no key is seen
    weights = torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None])
    weights = weights.masked_fill(~seen[None], 0.0)
    o = torch.einsum("hqk,khd->qhd", weights, v)
    return o, lse.transpose(0, 1)


def combine_segments(parts: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Attention over the union of segments from each one's (output, lse): outputs weighted
    by exp(lse_l - logsumexp(lse)); a segment a row does not see (lse -inf) weighs 0."""
    outs = torch.stack([o for o, _ in parts])  # [segments, q_len, heads, dim]
    lses = torch.stack([lse for _, lse in parts])  # [segments, q_len, heads]
    total = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - total.nan_to_num(neginf=0.0)).nan_to_num(0.0)
    return (weights[..., None] * outs).sum(dim=0)
