"""A Triton kernel for attention over mixed-precision block tables (issue 48; CUDA, or CPU under
TRITON_INTERPRET=1): the Triton backend's path once a page is demoted (`MixedBackend`).

One pass, one online softmax over all of a row's pages, whatever their levels: for each tile of
context positions the kernel looks each position's page up in the block table, reads the page's
level (`page_levels[page]`), and loads K and V from every level's pages with a mask that keeps
only the positions at that level (`load_levels`); a masked load reads no memory and yields 0,
so the sum over levels is each position's value at its own level, dequantized to float32 in
registers by `load_kv` (float, fp8, int8 C8, per-token-head int8/fp8 and int4 pages with their
scales: kvkernels/kv_quant.py). No per-level segments, no combine. The tile loop, the loads and
the partition reduce are kvkernels/triton_tiles.py's, the Triton backend's own.

Compute is float32 (queries cast up, exact fp32 products), so the result equals attention over
one dense tensor of the pages' dequantized values up to float32 rounding, as the torch path
(kvkernels/mixed_attention.py) computes it. One program covers one sequence, one KV head and a
block of query tokens times the head's query group (grouped-query rows packed, so a decode's
group of heads shares each K/V load); decodes and prefill chunks are the same kernel launched
with smaller or larger query blocks. A decode's context longer than a partition is split over
programs, one a partition, merged by the reduce kernel (flash-decoding, as the Triton
backend's decodes); a prefill chunk's is one program's loop. Up to MAX_LEVELS levels (the
precision ladder has at most three).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from kvlab.kernels.backend import check_query
from kvlab.kernels.launch import KVArgs, kv_args, seq_ids_tensor, split_batch
from kvlab.kernels.metadata import AttentionMetadata
from kvlab.kernels.triton_tiles import Partitions, attend_pages, store_rows

if TYPE_CHECKING:
    from kvlab.kernels.mixed_attention import LevelPages

MAX_LEVELS = 3  # level tensors the kernel takes: the cache's dtype and two steps down
_BLOCK_N = 64  # context positions per tile
_DECODE_ROWS = 16  # query rows (one token x its group's heads) per decode program, at least
_PREFILL_ROWS = 32  # query rows per prefill-chunk program, at least


@triton.jit
def _mixed_attention_kernel(
    q_ptr, out_ptr, levels_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr, seq_ids_ptr,
    part_max_ptr, part_sum_ptr, part_acc_ptr, num_parts,
    k0, v0, ks0, vs0, k_scale0, v_scale0,
    k1, v1, ks1, vs1, k_scale1, v_scale1,
    k2, v2, ks2, vs2, k_scale2, v_scale2,
    scale, stride_q_tok, stride_q_head, stride_out_tok, stride_out_head, stride_table,
    GROUP: tl.constexpr, TOKENS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PARTITION_SIZE: tl.constexpr,
    PARTITIONED: tl.constexpr,
    ROW0: tl.constexpr, MODE0: tl.constexpr, ROW1: tl.constexpr, MODE1: tl.constexpr,
    ROW2: tl.constexpr, MODE2: tl.constexpr, NUM_LEVELS: tl.constexpr,
):
    # axis 1: the query block, or (decodes over partitions) the context partition
    i, block, kv_head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PARTITIONED:
        q_block = 0
        lo = block * PARTITION_SIZE
    else:
        q_block = block
        lo = 0
    seq = tl.load(seq_ids_ptr + i).to(tl.int64)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    # causal: no row of this block sees past its last token's position (every row sees 0)
    hi = tl.minimum(seq_len, seq_len - q_len + (q_block + 1) * TOKENS)
    if PARTITIONED:
        hi = tl.minimum(hi, lo + PARTITION_SIZE)
    if (q_block * TOKENS >= q_len) | (lo >= hi):
        return  # (the reduce kernel reads only the partitions that hold context)
    # row r: query token r // GROUP of this block, head r % GROUP of the KV head's group
    r = tl.arange(0, BLOCK_M)
    token = q_block * TOKENS + r // GROUP
    heads = kv_head * GROUP + r % GROUP
    row_valid = (r < TOKENS * GROUP) & (token < q_len)
    rows = (q_start + token).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    mask = row_valid[:, None] & (d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + rows[:, None] * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    # float32 compute, exact products; each row causal at its token's position
    m_i, l_i, acc = attend_pages(
        q, seq_len - q_len + token, lo, hi, block_tables_ptr + seq * stride_table, levels_ptr,
        kv_head, scale, k0, ks0, k_scale0, k1, ks1, k_scale1, k2, ks2, k_scale2,
        v0, vs0, v_scale0, v1, vs1, v_scale1, v2, vs2, v_scale2, NUM_KV_HEADS, HEAD_DIM,
        PAGE_SIZE, BLOCK_M, BLOCK_N, BLOCK_D, "ieee", True, 0, ROW0, MODE0, ROW1, MODE1, ROW2,
        MODE2, NUM_LEVELS)
    store_rows(out_ptr, rows[:, None] * stride_out_tok + heads[:, None] * stride_out_head
               + d[None, :], mask, part_max_ptr, part_sum_ptr, part_acc_ptr,
               (i * (NUM_KV_HEADS * GROUP) + heads) * num_parts + block, row_valid, d, m_i, l_i,
               acc, HEAD_DIM, PARTITIONED)


def triton_mixed_attention(query: Tensor, levels: Sequence[LevelPages], page_levels: Tensor,
                           meta: AttentionMetadata, *, scale: float, num_kv_heads: int,
                           out: Tensor | None = None, partition_size: int = 512) -> Tensor:
    """Causal attention of query `[num_tokens, num_heads, head_dim]` over each sequence's
    pages, page p read from `levels[page_levels[p]]` (int8 `[num_page_ids]` on the query's
    device): float32 compute, cast to `out`'s dtype (the query's). Decodes whose contexts
    pass `partition_size` positions are split into partitions of that many, merged by the
    reduce kernel (flash-decoding); prefill chunks are not split."""
    assert 1 <= len(levels) <= MAX_LEVELS, f"the kernel reads at most {MAX_LEVELS} levels"
    check_query(query, meta, num_kv_heads)
    assert query.stride(-1) == 1, "head_dim must be contiguous"
    out = torch.empty_like(query) if out is None else out
    kv = [kv_args(lp.k_cache, lp.v_cache, lp.kv_quant) for lp in levels]
    for args in kv:
        assert args.k.is_contiguous() and args.v.is_contiguous(), "caches must be contiguous"
        assert args.num_kv_heads == num_kv_heads, "cache layout is [pages, page_size, kv_heads, _]"
    kv += [kv[0]] * (MAX_LEVELS - len(kv))  # unused (NUM_LEVELS): level 0 stands in
    call = _Call(query, out, kv, len(levels), page_levels, meta, scale, partition_size)
    decode_ids, prefill_ids = split_batch(meta)
    if decode_ids:
        max_len = max(meta.seq_lens_cpu[i] for i in decode_ids)
        _launch(call, decode_ids, _DECODE_ROWS, triton.cdiv(max_len, partition_size))
    if prefill_ids:
        _launch(call, prefill_ids, _PREFILL_ROWS, 1)
    return out


@dataclass(frozen=True, slots=True)
class _Call:
    """What every launch of one attention call shares."""

    query: Tensor
    out: Tensor
    kv: list[KVArgs]  # MAX_LEVELS of them
    num_levels: int
    page_levels: Tensor
    meta: AttentionMetadata
    scale: float
    partition_size: int


def _launch(call: _Call, seq_ids: list[int], min_rows: int, num_parts: int) -> None:
    """One kernel launch over `seq_ids` (query blocks of at least `min_rows` rows), with
    `num_parts` > 1 (decodes only) over context partitions, then the reduce kernel."""
    query, out, kv, meta = call.query, call.out, call.kv, call.meta
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = kv[0].num_kv_heads
    group = num_heads // num_kv_heads
    block_m = max(min_rows, triton.next_power_of_2(group))
    tokens = block_m // group  # query tokens per program
    parts = Partitions.of(len(seq_ids), num_parts, query)
    ids = seq_ids_tensor(seq_ids, meta.num_seqs, query.device)
    max_query_len = max(meta.query_lens_cpu[i] for i in seq_ids)
    blocks = num_parts if parts.partitioned else triton.cdiv(max_query_len, tokens)
    _mixed_attention_kernel[(len(seq_ids), blocks, num_kv_heads)](
        query, out, call.page_levels, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        ids, *parts.pointers, num_parts,
        *kv[0].pointers, *kv[1].pointers, *kv[2].pointers,
        call.scale, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        meta.block_tables.stride(0),
        GROUP=group, TOKENS=tokens, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        PAGE_SIZE=meta.page_size, BLOCK_M=block_m, BLOCK_N=_BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PARTITION_SIZE=call.partition_size, PARTITIONED=parts.partitioned,
        ROW0=kv[0].row, MODE0=kv[0].mode, ROW1=kv[1].row, MODE1=kv[1].mode,
        ROW2=kv[2].row, MODE2=kv[2].mode, NUM_LEVELS=call.num_levels,
    )
    if parts.partitioned:
        parts.reduce(out, meta.seq_lens, meta.query_start_loc, ids, call.partition_size, 0)
