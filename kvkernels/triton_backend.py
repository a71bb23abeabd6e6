"""Triton kernels for paged attention and the KV-cache ops (CUDA; CPU under TRITON_INTERPRET=1).

Decodes use flash-decoding: each (sequence, KV head, context partition) program runs an online
softmax over its partition for all query heads of the group, and a reduce kernel merges the
partitions; with one partition the first kernel writes the output itself. Prefill chunks (more
than one new token) run a flash-attention kernel over the block table, causal from the chunk's
offset in its context. A sliding window (a constexpr: full attention compiles as before) starts
each program's loop at its first visible position, so block table entries behind the window
(NULL_PAGE) are never read. Every kernel looks up each token's page through the block table, so any
page size works; tiles are independent of the page size. swap_pages moves pages between host and
device with torch index copies (a gather, one transfer, a scatter), not a Triton kernel.

Quantized pages (`kv_quant`, kvkernels/kv_quant.py): write_kv quantizes with kv_quant's torch code
(so the stored bytes are the reference backend's) and scatters them with its kernel; the
attention kernels load the stored values (fp8, int8, int4 nibbles) and scales (per tensor, per
channel, or the fp32 after each row) and dequantize in-kernel. The tile loop, the loads, the
online softmax and the partition reduce are kvkernels/triton_tiles.py's, shared with the
mixed-precision kernel (kvkernels/triton_mixed.py); the launch plumbing is kvkernels/launch.py's.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from kvlab.errors import KvlabError
from kvlab.kernels.backend import AttentionCall, KernelBackend, KVRows
from kvlab.kernels.launch import (
    KVArgs,
    check_cache_pair,
    dot_precision,
    kv_args,
    seq_ids_tensor,
    split_batch,
)
from kvlab.kernels.torch_backend import copy_pages_by_index, swap_pages_by_index
from kvlab.kernels.triton_tiles import Partitions, attend_cache, store_rows
from kvlab.specs.kv_dtype import KV_CACHE_DTYPES

_BLOCK_M = 64  # query rows per prefill program
_BLOCK_N = 64  # context tokens per tile
_COPY_BLOCK = 1024  # elements per copy program


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, stride_key_tok, stride_key_head,
    stride_value_tok, stride_value_head, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Reshape-and-cache: one program per token, its [heads, dim] rows to its slot (-1: none)."""
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + h * HEAD_DIM + d
    k = tl.load(key_ptr + tok * stride_key_tok + h * stride_key_head + d, mask=mask)
    v = tl.load(value_ptr + tok * stride_value_tok + h * stride_value_head + d, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, k_scale, v_scale,
    block_tables_ptr, seq_lens_ptr, query_start_ptr, seq_ids_ptr, out_ptr,
    part_max_ptr, part_sum_ptr, part_acc_ptr, scale, num_parts,
    stride_q_tok, stride_q_head, stride_out_tok, stride_out_head, stride_table,
    GROUP: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PARTITION_SIZE: tl.constexpr, PARTITIONED: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SLIDING_WINDOW: tl.constexpr, ROW: tl.constexpr,
    MODE: tl.constexpr,
):
    """A decode's partition: program (sequence, KV head, partition), the group's query heads
    as rows."""
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq = tl.load(seq_ids_ptr + i).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    # partitions start at the window's first position: block table entries before it are
    # never read (they may be NULL_PAGE)
    if SLIDING_WINDOW > 0:
        start = tl.maximum(seq_len - SLIDING_WINDOW, 0) + part * PARTITION_SIZE
    else:
        start = part * PARTITION_SIZE
    if start >= seq_len:
        return  # the reduce kernel counts only the partitions that hold context
    end = tl.minimum(start + PARTITION_SIZE, seq_len)
    row = tl.load(query_start_ptr + seq).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    mask = head_mask[:, None] & (d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + row * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
        mask=mask,
        other=0.0,
    )
    # not causal: every position of the partition precedes the new token
    m_i, l_i, acc = attend_cache(
        q, g, start, end, block_tables_ptr + seq * stride_table, kv_head, scale, k_cache_ptr,
        v_cache_ptr, k_scales_ptr, v_scales_ptr, k_scale, v_scale, NUM_KV_HEADS, HEAD_DIM,
        PAGE_SIZE, BLOCK_G, BLOCK_N, BLOCK_D, DOT_PRECISION, False, SLIDING_WINDOW, ROW, MODE)
    store_rows(out_ptr, row * stride_out_tok + heads[:, None] * stride_out_head + d[None, :],
               mask, part_max_ptr, part_sum_ptr, part_acc_ptr,
               (i * (NUM_KV_HEADS * GROUP) + heads) * num_parts + part, head_mask, d, m_i, l_i,
               acc, HEAD_DIM, PARTITIONED)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, k_scale, v_scale,
    block_tables_ptr, seq_lens_ptr, query_start_ptr, seq_ids_ptr, out_ptr, scale,
    stride_q_tok, stride_q_head, stride_out_tok, stride_out_head, stride_table,
    GROUP: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
    ROW: tl.constexpr, MODE: tl.constexpr,
):
    """A prefill chunk's block of query rows: program (sequence, block, query head), causal."""
    i = tl.program_id(0)
    q_block = tl.program_id(1)
    head = tl.program_id(2)
    seq = tl.load(seq_ids_ptr + i).to(tl.int64)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    if q_block * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < q_len
    rows = (q_start + offs_m).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    mask = row_valid[:, None] & (d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + rows[:, None] * stride_q_tok + head * stride_q_head + d[None, :],
        mask=mask,
        other=0.0,
    )
    # causal: no row of this block sees past its last row's position
    hi = tl.minimum(seq_len, seq_len - q_len + (q_block + 1) * BLOCK_M)
    # a window: from the first key this block's first row sees (entries before it may be
    # NULL_PAGE and are never read)
    if SLIDING_WINDOW > 0:
        lo = tl.maximum(seq_len - q_len + q_block * BLOCK_M - SLIDING_WINDOW + 1, 0)
    else:
        lo = 0
    # each query row's position in its context
    _, l_i, acc = attend_cache(
        q, seq_len - q_len + offs_m, lo, hi, block_tables_ptr + seq * stride_table,
        head // GROUP, scale, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, k_scale,
        v_scale, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION,
        True, SLIDING_WINDOW, ROW, MODE)
    if SLIDING_WINDOW > 0:
        # padding rows past the chunk may see no key at all (and are not stored)
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_i[:, None]
    o_off = rows[:, None] * stride_out_tok + head * stride_out_head + d[None, :]
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy_pages_kernel(
    k_cache_ptr, v_cache_ptr, pairs_ptr, PAGE_NUMEL: tl.constexpr, BLOCK: tl.constexpr
):
    pair = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    src = tl.load(pairs_ptr + 2 * pair).to(tl.int64) * PAGE_NUMEL
    dst = tl.load(pairs_ptr + 2 * pair + 1).to(tl.int64) * PAGE_NUMEL
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PAGE_NUMEL
    tl.store(k_cache_ptr + dst + offs, tl.load(k_cache_ptr + src + offs, mask=mask), mask=mask)
    tl.store(v_cache_ptr + dst + offs, tl.load(v_cache_ptr + src + offs, mask=mask), mask=mask)


class TritonBackend(KernelBackend):
    """Triton kernels; fp16/bf16 on CUDA, fp32 also under the interpreter (TRITON_INTERPRET=1).

    `partition_size` is the context each flash-decoding program covers; contexts longer than
    one partition are split and merged by the reduce kernel.
    """

    name = "triton"
    supports_sliding_window = True
    kv_cache_dtypes = tuple(KV_CACHE_DTYPES)

    def __init__(self, partition_size: int = 512) -> None:
        assert partition_size % _BLOCK_N == 0, "a partition is a whole number of tiles"
        self.partition_size = partition_size

    def check_device(self, device: torch.device) -> None:
        """A KvlabError when these kernels cannot run on `device`: on cpu only Triton's
        interpreter runs them, and it must be switched on before Triton is first imported."""
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise KvlabError(
                "attention_backend triton on cpu needs Triton's interpreter: start kvlab with "
                "TRITON_INTERPRET=1 in the environment (slow; for checking kernels), or use "
                "attention_backend torch", parameters=("attention_backend",))

    def _write_kv(self, rows: KVRows) -> None:
        """Rows quantized by `kv_quant` (kv_quant.py's torch code: the stored bytes are the
        reference's) and scattered by the kernel; None: cast to the cache's dtype there."""
        k_cache, v_cache = rows.k_cache, rows.v_cache
        check_cache_pair(k_cache, v_cache)
        if rows.key.shape[0] == 0:
            return
        key, value = rows.stored()
        assert key.stride(-1) == 1 and value.stride(-1) == 1, "head_dim must be contiguous"
        num_kv_heads, head_dim = k_cache.shape[2:]  # a stored row's width
        _write_kv_kernel[(key.shape[0],)](
            key,
            value,
            k_cache,
            v_cache,
            rows.slot_mapping,
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_H=triton.next_power_of_2(num_kv_heads),
            BLOCK_D=triton.next_power_of_2(head_dim),
        )

    def _paged_attention(self, call: AttentionCall) -> Tensor:
        """The decode kernel (flash-decoding) and the prefill kernel; pages stored by
        `kv_quant` are loaded as stored and dequantized in the kernels."""
        check_cache_pair(call.k_cache, call.v_cache)
        assert call.query.stride(-1) == 1, "head_dim must be contiguous"
        out = torch.empty_like(call.query) if call.out is None else call.out
        kv = kv_args(call.k_cache, call.v_cache, call.kv_quant)
        decode_ids, prefill_ids = split_batch(call.meta)
        if decode_ids:
            self._decode(call, kv, out, decode_ids)
        if prefill_ids:
            _prefill(call, kv, out, prefill_ids)
        return out

    def copy_pages(self, k_cache: Tensor, v_cache: Tensor, pairs: Tensor) -> None:
        """One copy kernel; a gather and a scatter where a page is both read and written."""
        check_cache_pair(k_cache, v_cache)
        if pairs.shape[0] == 0:
            return
        pairs = pairs.to(k_cache.device, torch.int64).contiguous()
        if bool(torch.isin(pairs[:, 1], pairs[:, 0]).any()):
            # a page both read and written would race between programs: gather first, then scatter
            copy_pages_by_index(k_cache, v_cache, pairs)
            return
        page_numel = k_cache[0].numel()
        grid = (pairs.shape[0], triton.cdiv(page_numel, _COPY_BLOCK))
        _copy_pages_kernel[grid](k_cache, v_cache, pairs, PAGE_NUMEL=page_numel, BLOCK=_COPY_BLOCK)

    def swap_pages(
        self, src_k: Tensor, src_v: Tensor, dst_k: Tensor, dst_v: Tensor, pairs: Tensor
    ) -> None:
        """Torch index copies (`swap_pages_by_index`), not a Triton kernel."""
        swap_pages_by_index(src_k, src_v, dst_k, dst_v, pairs)

    def _decode(self, call: AttentionCall, kv: KVArgs, out: Tensor, seq_ids: list[int]) -> None:
        """Launch the decode kernel over the sequences with one new token, then (contexts
        over one partition) the reduce kernel."""
        query, meta, sliding_window = call.query, call.meta, call.sliding_window
        num_heads, head_dim = query.shape[1:]
        num_kv_heads = kv.num_kv_heads
        group = num_heads // num_kv_heads
        max_len = max(meta.seq_lens_cpu[i] for i in seq_ids)
        if sliding_window > 0:  # partitions cover the window only
            max_len = min(max_len, sliding_window)
        parts = Partitions.of(len(seq_ids), triton.cdiv(max_len, self.partition_size), query)
        ids = seq_ids_tensor(seq_ids, meta.num_seqs, query.device)
        _decode_kernel[(len(seq_ids), num_kv_heads, parts.num_parts)](
            query, *kv.pointers, meta.block_tables, meta.seq_lens, meta.query_start_loc, ids,
            out, *parts.pointers, call.scale, parts.num_parts, query.stride(0), query.stride(1),
            out.stride(0), out.stride(1), meta.block_tables.stride(0),
            GROUP=group,
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            PAGE_SIZE=meta.page_size,
            PARTITION_SIZE=self.partition_size,
            PARTITIONED=parts.partitioned,
            BLOCK_G=max(16, triton.next_power_of_2(group)),
            BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
            BLOCK_N=_BLOCK_N,
            DOT_PRECISION=dot_precision(query.dtype),
            SLIDING_WINDOW=sliding_window,
            ROW=kv.row,
            MODE=kv.mode,
        )
        if parts.partitioned:
            parts.reduce(out, meta.seq_lens, meta.query_start_loc, ids, self.partition_size,
                         sliding_window)


def _prefill(call: AttentionCall, kv: KVArgs, out: Tensor, seq_ids: list[int]) -> None:
    """Launch the prefill-chunk kernel over the sequences with more than one new token."""
    query, meta = call.query, call.meta
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = kv.num_kv_heads
    max_query_len = max(meta.query_lens_cpu[i] for i in seq_ids)
    grid = (len(seq_ids), triton.cdiv(max_query_len, _BLOCK_M), num_heads)
    _prefill_kernel[grid](
        query, *kv.pointers, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        seq_ids_tensor(seq_ids, meta.num_seqs, query.device), out, call.scale, query.stride(0),
        query.stride(1), out.stride(0), out.stride(1), meta.block_tables.stride(0),
        GROUP=num_heads // num_kv_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE_SIZE=meta.page_size,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=dot_precision(query.dtype),
        SLIDING_WINDOW=call.sliding_window,
        ROW=kv.row,
        MODE=kv.mode,
    )
