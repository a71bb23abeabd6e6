"""Triton kernels of the `ascend` backend, written for triton-ascend (Ascend NPUs).

Plain `triton.language` only: no Ascend-only extension (`extract_slice`, `insert_slice`,
`sort`, ...), so every kernel also runs in Triton's interpreter (TRITON_INTERPRET=1) on CPU
tensors, where the tests check them against the torch reference. Conventions of triton-ascend:
- persistent programs: the grid is at most one program per core, and program p handles work
  items p, p + num_programs, ... (a grid larger than the core count is run in batches);
- attention reads the context through an extent table (runs of contiguous pages), so each K/V
  tile is one strided block at a scalar base address (a DMA on Ascend), never a per-token gather;
- 64-bit arithmetic stays scalar (cache base offsets); per-element offsets are 32-bit, since
  int64 vector adds are emulated with scalar code on Ascend's vector cores;
- softmax statistics and accumulators are fp32; caches may be fp16, bf16 or fp32.

int8 pages (kv_cache_dtype int8, vLLM-Ascend's C8; the constexpr C8): write_kv_kernel scatters
rows kvkernels/kv_quant.py quantized; the attention kernels load int8 K/V tiles and dequantize with
the layer's per-channel fp32 scales, loaded once per work item as [head_dim] vectors of its KV
head. A per-channel scale factors out of both products, so a tile is only cast (int8 values are
exact in fp16, bf16 and fp32) and the scales are applied once per item, in fp32:
    q . (k_int8 * k_scale) = (q * k_scale) . k_int8
    sum_n p_n * v_int8[n] * v_scale = (p . v_int8) * v_scale
The dots run in the query's dtype, as for float pages of the model's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    num_tokens,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Reshape-and-cache: token t's [heads, dim] rows go to slot slot_ptr[t] (-1: skipped)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    row = h * HEAD_DIM + d
    for tok in range(tl.program_id(0), num_tokens, tl.num_programs(0)):
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:
            base = slot * (NUM_KV_HEADS * HEAD_DIM)
            # 32-bit: one step's keys are far below 2^31 elements
            k = tl.load(key_ptr + tok * stride_key_tok + h * stride_key_head + d, mask=mask)
            v = tl.load(value_ptr + tok * stride_value_tok + h * stride_value_head + d, mask=mask)
            tl.store(k_cache_ptr + base + row, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + base + row, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    ext_start_ptr,
    ext_pages_ptr,
    ext_count_ptr,
    seq_lens_ptr,
    query_start_ptr,
    seq_ids_ptr,
    out_ptr,
    k_scale_ptr,
    v_scale_ptr,
    scale,
    num_items,
    stride_q_tok,
    stride_q_head,
    stride_out_tok,
    stride_out_head,
    stride_ext,
    GROUP: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    C8: tl.constexpr,
):
    """One new token per sequence: item = (sequence, KV head), all GROUP query heads at once.

    C8: int8 pages with fp32 [NUM_KV_HEADS, HEAD_DIM] scales at k/v_scale_ptr (else unused)."""
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    head_mask = g < GROUP
    d_mask = d < HEAD_DIM
    slot_stride = NUM_KV_HEADS * HEAD_DIM
    tile_off = n[:, None] * slot_stride + d[None, :]  # within one tile: 32-bit
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        seq = tl.load(seq_ids_ptr + item // NUM_KV_HEADS)
        kv_head = item % NUM_KV_HEADS
        seq_len = tl.load(seq_lens_ptr + seq)
        row = tl.load(query_start_ptr + seq).to(tl.int64)
        heads = kv_head * GROUP + g
        q = tl.load(
            q_ptr + row * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
            mask=head_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        if C8:
            k_channel = tl.load(k_scale_ptr + kv_head * HEAD_DIM + d, mask=d_mask, other=0.0)
            v_channel = tl.load(v_scale_ptr + kv_head * HEAD_DIM + d, mask=d_mask, other=0.0)
            q = (q.to(tl.float32) * k_channel[None, :]).to(q_ptr.dtype.element_ty)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        done = 0  # context tokens in the extents before this one
        ext_row = seq.to(tl.int64) * stride_ext
        for e in range(0, tl.load(ext_count_ptr + seq)):
            first = tl.load(ext_start_ptr + ext_row + e).to(tl.int64)
            ext_len = tl.load(ext_pages_ptr + ext_row + e) * PAGE_SIZE
            ext_tokens = tl.minimum(ext_len, seq_len - done)
            ext_base = first * PAGE_SIZE * slot_stride + kv_head * HEAD_DIM
            for t in range(0, ext_tokens, BLOCK_N):
                valid = t + n < ext_tokens
                kv_mask = valid[:, None] & d_mask[None, :]
                base = ext_base + t * slot_stride
                k = tl.load(k_cache_ptr + base + tile_off, mask=kv_mask, other=0.0)
                if C8:
                    k = k.to(q.dtype)
                s = tl.dot(q, tl.trans(k)) * scale
                s = tl.where(valid[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(v_cache_ptr + base + tile_off, mask=kv_mask, other=0.0)
                if C8:
                    v = v.to(q.dtype)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            done += ext_len
        o = acc / l_i[:, None]
        if C8:
            o = o * v_channel[None, :]
        o_off = row * stride_out_tok + heads[:, None] * stride_out_head + d[None, :]
        mask = head_mask[:, None] & d_mask[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    ext_start_ptr,
    ext_pages_ptr,
    ext_count_ptr,
    seq_lens_ptr,
    query_start_ptr,
    seq_ids_ptr,
    out_ptr,
    k_scale_ptr,
    v_scale_ptr,
    scale,
    num_items,
    num_q_blocks,
    stride_q_tok,
    stride_q_head,
    stride_out_tok,
    stride_out_head,
    stride_ext,
    GROUP: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    C8: tl.constexpr,
):
    """A prefill chunk: item = (sequence, block of BLOCK_M query rows, query head), causal.

    C8: int8 pages with fp32 [NUM_KV_HEADS, HEAD_DIM] scales at k/v_scale_ptr (else unused)."""
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_mask = d < HEAD_DIM
    slot_stride = NUM_KV_HEADS * HEAD_DIM
    tile_off = n[:, None] * slot_stride + d[None, :]
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        head = item % NUM_HEADS
        q_block = (item // NUM_HEADS) % num_q_blocks
        seq = tl.load(seq_ids_ptr + item // (NUM_HEADS * num_q_blocks))
        q_start = tl.load(query_start_ptr + seq)
        q_len = tl.load(query_start_ptr + seq + 1) - q_start
        if q_block * BLOCK_M < q_len:
            seq_len = tl.load(seq_lens_ptr + seq)
            offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
            pos_m = seq_len - q_len + offs_m  # each query row's position in its context
            row_valid = offs_m < q_len
            rows = (q_start + offs_m).to(tl.int64)
            kv_head = head // GROUP
            q = tl.load(
                q_ptr + rows[:, None] * stride_q_tok + head * stride_q_head + d[None, :],
                mask=row_valid[:, None] & d_mask[None, :],
                other=0.0,
            )
            if C8:
                k_channel = tl.load(k_scale_ptr + kv_head * HEAD_DIM + d, mask=d_mask, other=0.0)
                v_channel = tl.load(v_scale_ptr + kv_head * HEAD_DIM + d, mask=d_mask, other=0.0)
                q = (q.to(tl.float32) * k_channel[None, :]).to(q_ptr.dtype.element_ty)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            # causal: no row of this block sees past the block's last row
            hi = tl.minimum(seq_len, seq_len - q_len + (q_block + 1) * BLOCK_M)
            done = 0
            ext_row = seq.to(tl.int64) * stride_ext
            for e in range(0, tl.load(ext_count_ptr + seq)):
                first = tl.load(ext_start_ptr + ext_row + e).to(tl.int64)
                ext_len = tl.load(ext_pages_ptr + ext_row + e) * PAGE_SIZE
                ext_tokens = tl.minimum(ext_len, hi - done)
                ext_base = first * PAGE_SIZE * slot_stride + kv_head * HEAD_DIM
                for t in range(0, ext_tokens, BLOCK_N):
                    valid = t + n < ext_tokens
                    kv_mask = valid[:, None] & d_mask[None, :]
                    base = ext_base + t * slot_stride
                    k = tl.load(k_cache_ptr + base + tile_off, mask=kv_mask, other=0.0)
                    if C8:
                        k = k.to(q.dtype)
                    s = tl.dot(q, tl.trans(k)) * scale
                    visible = ((done + t + n)[None, :] <= pos_m[:, None]) & valid[None, :]
                    s = tl.where(visible, s, float("-inf"))
                    m_new = tl.maximum(m_i, tl.max(s, 1))
                    alpha = tl.exp(m_i - m_new)
                    p = tl.exp(s - m_new[:, None])
                    l_i = l_i * alpha + tl.sum(p, 1)
                    v = tl.load(v_cache_ptr + base + tile_off, mask=kv_mask, other=0.0)
                    if C8:
                        v = v.to(q.dtype)
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                    m_i = m_new
                done += ext_len
            o = acc / l_i[:, None]
            if C8:
                o = o * v_channel[None, :]
            o_off = rows[:, None] * stride_out_tok + head * stride_out_head + d[None, :]
            o_mask = row_valid[:, None] & d_mask[None, :]
            tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def move_pages_kernel(
    src_k_ptr,
    src_v_ptr,
    dst_k_ptr,
    dst_v_ptr,
    src_ids_ptr,
    dst_ids_ptr,
    num_items,
    NUM_CHUNKS: tl.constexpr,
    PAGE_NUMEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Page copy: item = (pair, chunk of BLOCK elements); page src_ids[i] -> page dst_ids[i]."""
    offs = tl.arange(0, BLOCK)
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        pair = item // NUM_CHUNKS
        chunk = (item % NUM_CHUNKS) * BLOCK
        src = tl.load(src_ids_ptr + pair).to(tl.int64) * PAGE_NUMEL + chunk
        dst = tl.load(dst_ids_ptr + pair).to(tl.int64) * PAGE_NUMEL + chunk
        mask = chunk + offs < PAGE_NUMEL
        tl.store(dst_k_ptr + dst + offs, tl.load(src_k_ptr + src + offs, mask=mask), mask=mask)
        tl.store(dst_v_ptr + dst + offs, tl.load(src_v_ptr + src + offs, mask=mask), mask=mask)
