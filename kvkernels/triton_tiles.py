"""The Triton pieces several attention kernels share (CUDA; CPU under TRITON_INTERPRET=1).

- `softmax_step`: one tile's online-softmax update (running max, sum, rescale factor); the
  triton backend's kernels, the mixed-precision kernel and the ascend kernels all take it.
- `load_kv` / `load_levels`: K or V rows loaded as stored and dequantized in registers
  (kvkernels/kv_quant.py's page formats), from one cache or from the level each page is at.
- `attend_pages`: the tile loop over a block table (online softmax of a block of query rows
  over context positions lo..hi-1), the one loop of the triton backend's decode and prefill
  kernels (`attend_cache`: one cache) and of the mixed-precision kernel.
- `store_rows` / `store_partials` / `decode_reduce_kernel` / `Partitions`: a program's output
  rows or flash-decoding's partition results, and the kernel that merges the partitions.

Constexprs in capitals, as in the kernels; every helper is inlined into its caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kvlab.kernels.kv_quant import (
    MODE_INT4,
    MODE_PER_CHANNEL,
    MODE_PER_TENSOR,
    MODE_PER_TOKEN_HEAD,
    MODE_PLAIN,
)

# KVQuant.mode values, as constants the kernels may read
_PLAIN = tl.constexpr(MODE_PLAIN)
_PER_TENSOR = tl.constexpr(MODE_PER_TENSOR)
_PER_CHANNEL = tl.constexpr(MODE_PER_CHANNEL)
_PER_TOKEN_HEAD = tl.constexpr(MODE_PER_TOKEN_HEAD)
_INT4 = tl.constexpr(MODE_INT4)


@triton.jit
def softmax_step(s, m_i, l_i, GUARD_EMPTY: tl.constexpr):
    """One tile's online-softmax update of rows with scores `s` (masked ones -inf): the
    tile's probabilities, the factor that rescales the earlier accumulator, the new running
    max and sum. GUARD_EMPTY: a row may have seen no key yet (its max still -inf), where
    exp(-inf - -inf) would be NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = m_new
    if GUARD_EMPTY:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_use)
    p = tl.exp(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def load_kv(
    cache_ptr,
    scales_ptr,
    tensor_scale,
    slot,
    kv_head,
    d,
    valid,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROW: tl.constexpr,
    MODE: tl.constexpr,
):
    """K or V of `kv_head` at `slot`s, `[len(slot), len(d)]`: as stored for float pages
    (MODE 0), else decoded to float32 as kvkernels/kv_quant.py stores them (KVQuant.mode).

    `cache_ptr` points at the pages as their values' dtype, ROW elements a (slot, head) row;
    `scales_ptr` at the C8 [num_kv_heads, HEAD_DIM] scales (MODE 2) or at the pages as
    float32 (MODES 3 and 4: a row's scale follows its values)."""
    row = slot[:, None] * (NUM_KV_HEADS * ROW) + kv_head * ROW
    mask = valid[:, None] & (d[None, :] < HEAD_DIM)
    if MODE == _INT4:
        packed = tl.load(cache_ptr + row + d[None, :] // 2, mask=mask, other=0).to(tl.int32)
        nibble = (packed >> ((d[None, :] % 2) * 4)) & 0xF
        x = tl.where(nibble >= 8, nibble - 16, nibble).to(tl.float32)
    elif MODE == _PLAIN:
        x = tl.load(cache_ptr + row + d[None, :], mask=mask, other=0.0)
    else:  # masked lanes are undefined (no `other` casts to both int8 and fp8): zeroed
        x = tl.where(mask, tl.load(cache_ptr + row + d[None, :], mask=mask).to(tl.float32), 0.0)
    if MODE == _PER_TENSOR:
        x = x * tensor_scale
    elif MODE == _PER_CHANNEL:
        channel = tl.load(scales_ptr + kv_head * HEAD_DIM + d, mask=d < HEAD_DIM, other=0.0)
        x = x * channel[None, :]
    elif MODE == _INT4:
        x = x * tl.load(scales_ptr + (row + HEAD_DIM // 2) // 4, mask=valid[:, None], other=0.0)
    elif MODE == _PER_TOKEN_HEAD:
        x = x * tl.load(scales_ptr + (row + HEAD_DIM) // 4, mask=valid[:, None], other=0.0)
    return x


@triton.jit
def load_levels(
    level, slot, kv_head, d, valid,
    c0, s0, t0, c1, s1, t1, c2, s2, t2,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    ROW0: tl.constexpr, MODE0: tl.constexpr, ROW1: tl.constexpr, MODE1: tl.constexpr,
    ROW2: tl.constexpr, MODE2: tl.constexpr, NUM_LEVELS: tl.constexpr,
):
    """K or V `[len(slot), len(d)]` of `kv_head` at `slot`s. NUM_LEVELS 0: one cache (c0, s0,
    t0: its pages, scales and per-tensor scale, as `load_kv` takes them), as `load_kv` returns
    it. Else float32, each row read from the level `level` gives it (cN, sN, tN: level N's);
    lanes masked at every other level load nothing and add 0."""
    if NUM_LEVELS == 0:
        x = load_kv(c0, s0, t0, slot, kv_head, d, valid, NUM_KV_HEADS, HEAD_DIM, ROW0, MODE0)
    else:
        x = load_kv(c0, s0, t0, slot, kv_head, d, valid & (level == 0),
                    NUM_KV_HEADS, HEAD_DIM, ROW0, MODE0).to(tl.float32)
    if NUM_LEVELS > 1:
        x += load_kv(c1, s1, t1, slot, kv_head, d, valid & (level == 1),
                     NUM_KV_HEADS, HEAD_DIM, ROW1, MODE1).to(tl.float32)
    if NUM_LEVELS > 2:
        x += load_kv(c2, s2, t2, slot, kv_head, d, valid & (level == 2),
                     NUM_KV_HEADS, HEAD_DIM, ROW2, MODE2).to(tl.float32)
    return x


@triton.jit
def attend_pages(
    q, pos_m, lo, hi, table_ptr, levels_ptr, kv_head, scale,
    k0, ks0, k_scale0, k1, ks1, k_scale1, k2, ks2, k_scale2,
    v0, vs0, v_scale0, v1, vs1, v_scale1, v2, vs2, v_scale2,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
    ROW0: tl.constexpr, MODE0: tl.constexpr, ROW1: tl.constexpr, MODE1: tl.constexpr,
    ROW2: tl.constexpr, MODE2: tl.constexpr, NUM_LEVELS: tl.constexpr,
):
    """The online softmax of BLOCK_M query rows `q` over context positions lo..hi-1 of the
    block table at `table_ptr`: (running max, sum, unnormalized output) per row.

    K and V are read as `load_levels` reads them (NUM_LEVELS 0: level 0's arguments only; else
    each page at its level, `levels_ptr[page]`) and cast to q's dtype. CAUSAL: row r sees
    positions <= pos_m[r] only (and, with a SLIDING_WINDOW W > 0, > pos_m[r] - W); else every
    position lo..hi-1 (a decode's partition, already inside its window)."""
    d = tl.arange(0, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile in range(lo, hi, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        valid = pos < hi
        page = tl.load(table_ptr + pos // PAGE_SIZE, mask=valid, other=0)
        level = 0
        if NUM_LEVELS > 0:
            level = tl.load(levels_ptr + page, mask=valid, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        k = load_levels(level, slot, kv_head, d, valid, k0, ks0, k_scale0, k1, ks1, k_scale1,
                        k2, ks2, k_scale2, NUM_KV_HEADS, HEAD_DIM, ROW0, MODE0, ROW1, MODE1,
                        ROW2, MODE2, NUM_LEVELS).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        if CAUSAL:
            visible = (pos[None, :] <= pos_m[:, None]) & valid[None, :]
            if SLIDING_WINDOW > 0:
                visible = visible & (pos[None, :] > pos_m[:, None] - SLIDING_WINDOW)
            s = tl.where(visible, s, float("-inf"))
        else:
            s = tl.where(valid[None, :], s, float("-inf"))
        p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, CAUSAL and SLIDING_WINDOW > 0)
        v = load_levels(level, slot, kv_head, d, valid, v0, vs0, v_scale0, v1, vs1, v_scale1,
                        v2, vs2, v_scale2, NUM_KV_HEADS, HEAD_DIM, ROW0, MODE0, ROW1, MODE1,
                        ROW2, MODE2, NUM_LEVELS).to(q.dtype)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
    return m_i, l_i, acc


@triton.jit
def attend_cache(
    q, pos_m, lo, hi, table_ptr, kv_head, scale, k_ptr, v_ptr, ks_ptr, vs_ptr, k_scale, v_scale,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, CAUSAL: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
    ROW: tl.constexpr, MODE: tl.constexpr,
):
    """`attend_pages` over one cache (its pages at one precision, `load_kv`'s arguments in
    `KVArgs.pointers`' order): K and V cast to q's dtype."""
    return attend_pages(
        q, pos_m, lo, hi, table_ptr, table_ptr, kv_head, scale,
        k_ptr, ks_ptr, k_scale, k_ptr, ks_ptr, k_scale, k_ptr, ks_ptr, k_scale,
        v_ptr, vs_ptr, v_scale, v_ptr, vs_ptr, v_scale, v_ptr, vs_ptr, v_scale,
        NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION, CAUSAL,
        SLIDING_WINDOW, ROW, MODE, ROW, MODE, ROW, MODE, 0,
    )


@triton.jit
def store_partials(part_max_ptr, part_sum_ptr, part_acc_ptr, part_row, row_mask, d, m_i, l_i,
                   acc, HEAD_DIM: tl.constexpr):
    """One partition's (running max, sum, unnormalized output) of rows `part_row` in the
    layout `decode_reduce_kernel` reads."""
    tl.store(part_max_ptr + part_row, m_i, mask=row_mask)
    tl.store(part_sum_ptr + part_row, l_i, mask=row_mask)
    acc_off = part_row[:, None] * HEAD_DIM + d[None, :]
    tl.store(part_acc_ptr + acc_off, acc, mask=row_mask[:, None] & (d[None, :] < HEAD_DIM))


@triton.jit
def store_rows(out_ptr, o_off, mask, part_max_ptr, part_sum_ptr, part_acc_ptr, part_row,
               row_mask, d, m_i, l_i, acc, HEAD_DIM: tl.constexpr, PARTITIONED: tl.constexpr):
    """A program's rows when its loop is done: PARTITIONED, the partition's partials
    (`store_partials`); else the output, normalized, at `out_ptr + o_off`."""
    if PARTITIONED:
        store_partials(part_max_ptr, part_sum_ptr, part_acc_ptr, part_row, row_mask, d, m_i,
                       l_i, acc, HEAD_DIM)
    else:
        o = acc / l_i[:, None]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def decode_reduce_kernel(
    out_ptr,
    seq_lens_ptr,
    query_start_ptr,
    seq_ids_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    num_parts,
    stride_out_tok,
    stride_out_head,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
):
    """Flash-decoding's merge: one program per (sequence, query head) weighs its partitions'
    outputs by their sums and maxima and writes the decode's output row."""
    i = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(seq_ids_ptr + i).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    row = tl.load(query_start_ptr + seq).to(tl.int64)
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    if SLIDING_WINDOW > 0:
        valid = p < tl.cdiv(tl.minimum(seq_len, SLIDING_WINDOW), PARTITION_SIZE)
    else:
        valid = p < tl.cdiv(seq_len, PARTITION_SIZE)
    base = (i * NUM_HEADS + head) * num_parts
    m = tl.load(part_max_ptr + base + p, mask=valid, other=float("-inf"))
    weight = tl.exp(m - tl.max(m, 0))  # exp(-inf) = 0 drops empty partitions
    total = tl.sum(tl.load(part_sum_ptr + base + p, mask=valid, other=0.0) * weight, 0)
    acc_mask = valid[:, None] & (d[None, :] < HEAD_DIM)
    acc = tl.load(
        part_acc_ptr + (base + p)[:, None] * HEAD_DIM + d[None, :], mask=acc_mask, other=0.0
    )
    o = tl.sum(acc * weight[:, None], 0) / total
    o_off = row * stride_out_tok + head * stride_out_head + d
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@dataclass(frozen=True, slots=True)
class Partitions:
    """Flash-decoding's scratch for one launch: `num_parts` partitions of each decode's
    context, and per (decode, query head, partition) the max, the sum and the output."""

    num_parts: int
    part_max: Tensor
    part_sum: Tensor
    part_acc: Tensor

    @staticmethod
    def of(num_decodes: int, num_parts: int, query: Tensor) -> Partitions:
        """Buffers for `num_decodes` decodes of `query`'s heads (1-element ones, unused, for
        one partition)."""
        num_heads, head_dim = query.shape[1:]
        shape = (num_decodes, num_heads, num_parts) if num_parts > 1 else (1, 1, 1)
        part_max = torch.empty(shape, dtype=torch.float32, device=query.device)
        part_acc = torch.empty((*shape, head_dim), dtype=torch.float32, device=query.device)
        return Partitions(num_parts, part_max, torch.empty_like(part_max), part_acc)

    @property
    def partitioned(self) -> bool:
        """More than one partition: the attention kernel writes partials, the reduce merges."""
        return self.num_parts > 1

    @property
    def pointers(self) -> tuple[Tensor, Tensor, Tensor]:
        """The buffers in the kernels' argument order."""
        return (self.part_max, self.part_sum, self.part_acc)

    def reduce(self, out: Tensor, seq_lens: Tensor, query_start_loc: Tensor, ids: Tensor,
               partition_size: int, sliding_window: int) -> None:
        """Merge the partitions into `out`'s decode rows (`decode_reduce_kernel`)."""
        num_heads, head_dim = out.shape[1:]
        decode_reduce_kernel[(ids.shape[0], num_heads)](
            out, seq_lens, query_start_loc, ids, *self.pointers, self.num_parts,
            out.stride(0), out.stride(1), NUM_HEADS=num_heads, HEAD_DIM=head_dim,
            PARTITION_SIZE=partition_size, BLOCK_P=triton.next_power_of_2(self.num_parts),
            BLOCK_D=max(16, triton.next_power_of_2(head_dim)), SLIDING_WINDOW=sliding_window,
        )
