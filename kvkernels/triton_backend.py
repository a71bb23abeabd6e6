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
channel, or the fp32 after each row) and dequantize in-kernel (`_load_kv`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kvlab.errors import KvlabError
from kvlab.kernels.kv_quant import (
    MODE_INT4,
    MODE_PER_CHANNEL,
    MODE_PER_TENSOR,
    MODE_PER_TOKEN_HEAD,
    MODE_PLAIN,
    KVQuant,
)
from kvlab.kernels.metadata import AttentionMetadata
from kvlab.kernels.torch_backend import copy_pages_by_index, swap_pages_by_index
from kvlab.specs.kv_dtype import KV_CACHE_DTYPES

# KVQuant.mode values, as constants the kernels may read
_PLAIN = tl.constexpr(MODE_PLAIN)
_PER_TENSOR = tl.constexpr(MODE_PER_TENSOR)
_PER_CHANNEL = tl.constexpr(MODE_PER_CHANNEL)
_PER_TOKEN_HEAD = tl.constexpr(MODE_PER_TOKEN_HEAD)
_INT4 = tl.constexpr(MODE_INT4)

_BLOCK_M = 64  # query rows per prefill program
_BLOCK_N = 64  # context tokens per tile
_COPY_BLOCK = 1024  # elements per copy program


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
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
def _load_kv(
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
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scales_ptr,
    v_scales_ptr,
    k_scale,
    v_scale,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    seq_ids_ptr,
    out_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    scale,
    num_parts,
    stride_q_tok,
    stride_q_head,
    stride_out_tok,
    stride_out_head,
    stride_table,
    GROUP: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    PARTITIONED: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    ROW: tl.constexpr,
    MODE: tl.constexpr,
):
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
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + row * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
        mask=head_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for tile in range(start, end, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        valid = pos < end
        page = tl.load(
            block_tables_ptr + seq * stride_table + pos // PAGE_SIZE, mask=valid, other=0
        )
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        k = _load_kv(k_cache_ptr, k_scales_ptr, k_scale, slot, kv_head, d, valid,
                     NUM_KV_HEADS, HEAD_DIM, ROW, MODE).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv(v_cache_ptr, v_scales_ptr, v_scale, slot, kv_head, d, valid,
                     NUM_KV_HEADS, HEAD_DIM, ROW, MODE).to(q.dtype)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if PARTITIONED:
        part_row = (i * (NUM_KV_HEADS * GROUP) + heads) * num_parts + part
        tl.store(part_max_ptr + part_row, m_i, mask=head_mask)
        tl.store(part_sum_ptr + part_row, l_i, mask=head_mask)
        acc_off = part_row[:, None] * HEAD_DIM + d[None, :]
        tl.store(part_acc_ptr + acc_off, acc, mask=head_mask[:, None] & d_mask[None, :])
    else:
        o = acc / l_i[:, None]
        o_off = row * stride_out_tok + heads[:, None] * stride_out_head + d[None, :]
        mask = head_mask[:, None] & d_mask[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decode_reduce_kernel(
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


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scales_ptr,
    v_scales_ptr,
    k_scale,
    v_scale,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    seq_ids_ptr,
    out_ptr,
    scale,
    stride_q_tok,
    stride_q_head,
    stride_out_tok,
    stride_out_head,
    stride_table,
    GROUP: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    ROW: tl.constexpr,
    MODE: tl.constexpr,
):
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
    pos_m = seq_len - q_len + offs_m  # position of each query row in its context
    row_valid = offs_m < q_len
    rows = (q_start + offs_m).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    kv_head = head // GROUP
    q = tl.load(
        q_ptr + rows[:, None] * stride_q_tok + head * stride_q_head + d[None, :],
        mask=row_valid[:, None] & d_mask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # causal: no row of this block sees past its last row's position
    hi = tl.minimum(seq_len, seq_len - q_len + (q_block + 1) * BLOCK_M)
    # a window: from the first key this block's first row sees (entries before it may be
    # NULL_PAGE and are never read)
    if SLIDING_WINDOW > 0:
        lo = tl.maximum(seq_len - q_len + q_block * BLOCK_M - SLIDING_WINDOW + 1, 0)
    else:
        lo = 0
    for tile in range(lo, hi, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        valid = pos < hi
        page = tl.load(
            block_tables_ptr + seq * stride_table + pos // PAGE_SIZE, mask=valid, other=0
        )
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        k = _load_kv(k_cache_ptr, k_scales_ptr, k_scale, slot, kv_head, d, valid,
                     NUM_KV_HEADS, HEAD_DIM, ROW, MODE).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        visible = (pos[None, :] <= pos_m[:, None]) & valid[None, :]
        if SLIDING_WINDOW > 0:
            visible = visible & (pos[None, :] > pos_m[:, None] - SLIDING_WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
        if SLIDING_WINDOW > 0:
            # a row may see nothing yet (tiles before its window): exp(-inf - -inf) is NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv(v_cache_ptr, v_scales_ptr, v_scale, slot, kv_head, d, valid,
                     NUM_KV_HEADS, HEAD_DIM, ROW, MODE).to(q.dtype)
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if SLIDING_WINDOW > 0:
        # padding rows past the chunk may see no key at all (and are not stored)
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_i[:, None]
    o_off = rows[:, None] * stride_out_tok + head * stride_out_head + d[None, :]
    tl.store(
        out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_mask[None, :]
    )


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


class TritonBackend:
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

    def write_kv(
        self,
        key: Tensor,
        value: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        slot_mapping: Tensor,
        kv_quant: KVQuant | None = None,
    ) -> None:
        """Store key/value rows `[num_tokens, num_kv_heads, head_dim]` at their slots (-1: skip),
        quantized by `kv_quant` (kv_quant.py's torch code: the stored bytes are the reference's)
        and scattered by the kernel; None: cast to the cache's dtype in the kernel."""
        _check_cache(k_cache, v_cache)
        if key.shape[0] == 0:
            return
        if kv_quant is not None:
            key, value = kv_quant.quantize(key, "k"), kv_quant.quantize(value, "v")
        assert key.stride(-1) == 1 and value.stride(-1) == 1, "head_dim must be contiguous"
        num_kv_heads, head_dim = k_cache.shape[2:]  # a stored row's width
        _write_kv_kernel[(key.shape[0],)](
            key,
            value,
            k_cache,
            v_cache,
            slot_mapping,
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_H=triton.next_power_of_2(num_kv_heads),
            BLOCK_D=triton.next_power_of_2(head_dim),
        )

    def paged_attention(
        self,
        query: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        meta: AttentionMetadata,
        *,
        scale: float,
        num_kv_heads: int,
        out: Tensor | None = None,
        sliding_window: int = 0,
        kv_quant: KVQuant | None = None,
    ) -> Tensor:
        """Causal attention of query `[num_tokens, num_heads, head_dim]` over the paged context;
        with `sliding_window` W > 0 a row at position p sees positions p - W + 1 .. p only.
        Pages stored by `kv_quant` are loaded as stored and dequantized in the kernels."""
        _check_cache(k_cache, v_cache)
        assert k_cache.shape[2] == num_kv_heads, "cache layout is [pages, page_size, kv_heads, dim]"
        assert query.shape[0] == meta.num_tokens, "one query row per new token"
        assert query.shape[1] % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
        assert query.stride(-1) == 1, "head_dim must be contiguous"
        out = torch.empty_like(query) if out is None else out
        kv = _kv_args(k_cache, v_cache, kv_quant)
        decode_ids = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        prefill_ids = [i for i, n in enumerate(meta.query_lens_cpu) if n > 1]
        if decode_ids:
            self._decode(query, kv, meta, decode_ids, scale, out, sliding_window)
        if prefill_ids:
            _prefill(query, kv, meta, prefill_ids, scale, out, sliding_window)
        return out

    def copy_pages(self, k_cache: Tensor, v_cache: Tensor, pairs: Tensor) -> None:
        """Copy device pages in place: `pairs[n, 2]` of (src, dst), all read before any write."""
        _check_cache(k_cache, v_cache)
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
        """Copy pages `pairs[n, 2]` of (src, dst) between caches, with torch index copies."""
        swap_pages_by_index(src_k, src_v, dst_k, dst_v, pairs)

    def _decode(
        self,
        query: Tensor,
        kv: _KVArgs,
        meta: AttentionMetadata,
        seq_ids: list[int],
        scale: float,
        out: Tensor,
        sliding_window: int,
    ) -> None:
        num_heads, head_dim = query.shape[1:]
        num_kv_heads = kv.num_kv_heads
        group = num_heads // num_kv_heads
        max_len = max(meta.seq_lens_cpu[i] for i in seq_ids)
        if sliding_window > 0:  # partitions cover the window only
            max_len = min(max_len, sliding_window)
        num_parts = triton.cdiv(max_len, self.partition_size)
        partitioned = num_parts > 1
        parts = (len(seq_ids), num_heads, num_parts) if partitioned else (1, 1, 1)
        part_max = torch.empty(parts, dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty((*parts, head_dim), dtype=torch.float32, device=query.device)
        ids = _seq_ids_tensor(seq_ids, meta.num_seqs, query.device)
        block_d = max(16, triton.next_power_of_2(head_dim))
        _decode_kernel[(len(seq_ids), num_kv_heads, num_parts)](
            query,
            *kv.pointers,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            ids,
            out,
            part_max,
            part_sum,
            part_acc,
            scale,
            num_parts,
            query.stride(0),
            query.stride(1),
            out.stride(0),
            out.stride(1),
            meta.block_tables.stride(0),
            GROUP=group,
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            PAGE_SIZE=meta.page_size,
            PARTITION_SIZE=self.partition_size,
            PARTITIONED=partitioned,
            BLOCK_G=max(16, triton.next_power_of_2(group)),
            BLOCK_D=block_d,
            BLOCK_N=_BLOCK_N,
            DOT_PRECISION=_dot_precision(query.dtype),
            SLIDING_WINDOW=sliding_window,
            ROW=kv.row,
            MODE=kv.mode,
        )
        if partitioned:
            _decode_reduce_kernel[(len(seq_ids), num_heads)](
                out,
                meta.seq_lens,
                meta.query_start_loc,
                ids,
                part_max,
                part_sum,
                part_acc,
                num_parts,
                out.stride(0),
                out.stride(1),
                NUM_HEADS=num_heads,
                HEAD_DIM=head_dim,
                PARTITION_SIZE=self.partition_size,
                BLOCK_P=triton.next_power_of_2(num_parts),
                BLOCK_D=block_d,
                SLIDING_WINDOW=sliding_window,
            )


def _prefill(
    query: Tensor,
    kv: _KVArgs,
    meta: AttentionMetadata,
    seq_ids: list[int],
    scale: float,
    out: Tensor,
    sliding_window: int,
) -> None:
    """Launch the prefill-chunk kernel over the sequences with more than one new token."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = kv.num_kv_heads
    max_query_len = max(meta.query_lens_cpu[i] for i in seq_ids)
    grid = (len(seq_ids), triton.cdiv(max_query_len, _BLOCK_M), num_heads)
    _prefill_kernel[grid](
        query,
        *kv.pointers,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        _seq_ids_tensor(seq_ids, meta.num_seqs, query.device),
        out,
        scale,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        meta.block_tables.stride(0),
        GROUP=num_heads // num_kv_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE_SIZE=meta.page_size,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=_dot_precision(query.dtype),
        SLIDING_WINDOW=sliding_window,
        ROW=kv.row,
        MODE=kv.mode,
    )


@dataclass(frozen=True, slots=True)
class _KVArgs:
    """What the attention kernels take of a layer's K and V caches: the pages as their stored
    values' dtype, the scale tensors, the per-tensor scales, a row's width and the mode."""

    k: Tensor
    v: Tensor
    k_scales: Tensor
    v_scales: Tensor
    k_scale: float
    v_scale: float
    row: int
    mode: int

    @property
    def num_kv_heads(self) -> int:
        """KV heads of the caches."""
        return self.k.shape[2]

    @property
    def pointers(self) -> tuple[Tensor | float, ...]:
        """The kernels' cache arguments, in their order."""
        return (self.k, self.v, self.k_scales, self.v_scales, self.k_scale, self.v_scale)


def _kv_args(k_cache: Tensor, v_cache: Tensor, kv_quant: KVQuant | None) -> _KVArgs:
    """The kernels' view of a layer's caches stored by `kv_quant` (None: float pages; the
    scale arguments are then unused, the caches stand in for them)."""
    row = k_cache.shape[3]
    if kv_quant is None:
        return _KVArgs(k_cache, v_cache, k_cache, v_cache, 1.0, 1.0, row, MODE_PLAIN)
    mode = kv_quant.mode
    k_scales, v_scales = k_cache, v_cache
    if mode == MODE_PER_CHANNEL:
        k_channel, v_channel = kv_quant.channel_scale("k"), kv_quant.channel_scale("v")
        assert k_channel is not None and v_channel is not None
        k_scales, v_scales = k_channel, v_channel
    elif mode in (MODE_PER_TOKEN_HEAD, MODE_INT4):
        k_scales, v_scales = kv_quant.scale_view(k_cache), kv_quant.scale_view(v_cache)
    return _KVArgs(kv_quant.data_view(k_cache), kv_quant.data_view(v_cache), k_scales,
                   v_scales, kv_quant.k_scale, kv_quant.v_scale, row, mode)


def _seq_ids_tensor(seq_ids: list[int], num_seqs: int, device: torch.device) -> Tensor:
    """Device int32 ids of the sequences one launch covers (an arange when it covers all)."""
    if len(seq_ids) == num_seqs:
        return torch.arange(num_seqs, dtype=torch.int32, device=device)
    return torch.tensor(seq_ids, dtype=torch.int32, device=device)


def _dot_precision(dtype: torch.dtype) -> str:
    """Exact fp32 products for fp32 inputs (TF32 would cost about 1e-3 relative error)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_cache(k_cache: Tensor, v_cache: Tensor) -> None:
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert k_cache.shape == v_cache.shape, "K and V caches must have the same shape"
