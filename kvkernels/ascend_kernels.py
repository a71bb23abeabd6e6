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

Decode and prefill share the extent loop (`_attend_extents`, causal for prefill only) and the
online-softmax step of the Triton backend's kernels (kvkernels/triton_tiles.py, `softmax_step`:
plain Triton, inlined by the compiler as every @triton.jit helper).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvlab.kernels.triton_tiles import softmax_step


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
def _channel_scales(k_scale_ptr, v_scale_ptr, kv_head, d, d_mask, HEAD_DIM: tl.constexpr):
    """C8: the layer's fp32 per-channel K and V scales of `kv_head`, [BLOCK_D] each."""
    k_channel = tl.load(k_scale_ptr + kv_head * HEAD_DIM + d, mask=d_mask, other=0.0)
    v_channel = tl.load(v_scale_ptr + kv_head * HEAD_DIM + d, mask=d_mask, other=0.0)
    return k_channel, v_channel


@triton.jit
def _attend_extents(
    q, pos_m, hi, seq, kv_head, k_cache_ptr, v_cache_ptr, ext_start_ptr, ext_pages_ptr,
    ext_count_ptr, scale, stride_ext, n, d_mask, tile_off,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, SLOT_STRIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, C8: tl.constexpr,
):
    """The online softmax of BLOCK_M query rows `q` over context tokens 0..hi-1 of sequence
    `seq`, read extent by extent (`n`, `d_mask`, `tile_off`: a tile's token and channel offsets,
    made once per program): (running max, sum, unnormalized output) per row. CAUSAL: row r
    sees tokens <= pos_m[r] only. C8: int8 tiles, cast to q's dtype (their scales are the
    caller's)."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    done = 0  # context tokens in the extents before this one
    ext_row = seq.to(tl.int64) * stride_ext
    for e in range(0, tl.load(ext_count_ptr + seq)):
        first = tl.load(ext_start_ptr + ext_row + e).to(tl.int64)
        ext_len = tl.load(ext_pages_ptr + ext_row + e) * PAGE_SIZE
        ext_tokens = tl.minimum(ext_len, hi - done)
        ext_base = first * PAGE_SIZE * SLOT_STRIDE + kv_head * HEAD_DIM
        for t in range(0, ext_tokens, BLOCK_N):
            valid = t + n < ext_tokens
            kv_mask = valid[:, None] & d_mask[None, :]
            base = ext_base + t * SLOT_STRIDE
            k = tl.load(k_cache_ptr + base + tile_off, mask=kv_mask, other=0.0)
            if C8:
                k = k.to(q.dtype)
            s = tl.dot(q, tl.trans(k)) * scale
            if CAUSAL:
                visible = ((done + t + n)[None, :] <= pos_m[:, None]) & valid[None, :]
                s = tl.where(visible, s, float("-inf"))
            else:
                s = tl.where(valid[None, :], s, float("-inf"))
            p, alpha, m_i, l_i = softmax_step(s, m_i, l_i, False)
            v = tl.load(v_cache_ptr + base + tile_off, mask=kv_mask, other=0.0)
            if C8:
                v = v.to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        done += ext_len
    return m_i, l_i, acc


@triton.jit
def decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, ext_start_ptr, ext_pages_ptr, ext_count_ptr,
    seq_lens_ptr, query_start_ptr, seq_ids_ptr, out_ptr, k_scale_ptr, v_scale_ptr, scale,
    num_items, stride_q_tok, stride_q_head, stride_out_tok, stride_out_head, stride_ext,
    GROUP: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, C8: tl.constexpr,
):
    """One new token per sequence: item = (sequence, KV head), all GROUP query heads at once.

    C8: int8 pages with fp32 [NUM_KV_HEADS, HEAD_DIM] scales at k/v_scale_ptr (else unused)."""
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    head_mask = g < GROUP
    d_mask = d < HEAD_DIM
    tile_off = n[:, None] * (NUM_KV_HEADS * HEAD_DIM) + d[None, :]  # within one tile: 32-bit
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        seq = tl.load(seq_ids_ptr + item // NUM_KV_HEADS)
        kv_head = item % NUM_KV_HEADS
        row = tl.load(query_start_ptr + seq).to(tl.int64)
        heads = kv_head * GROUP + g
        q = tl.load(
            q_ptr + row * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
            mask=head_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        if C8:
            k_channel, v_channel = _channel_scales(k_scale_ptr, v_scale_ptr, kv_head, d, d_mask,
                                                   HEAD_DIM)
            q = (q.to(tl.float32) * k_channel[None, :]).to(q_ptr.dtype.element_ty)
        # not causal: the whole context precedes the new token
        _, l_i, acc = _attend_extents(
            q, g, tl.load(seq_lens_ptr + seq), seq, kv_head, k_cache_ptr, v_cache_ptr,
            ext_start_ptr, ext_pages_ptr, ext_count_ptr, scale, stride_ext, n, d_mask, tile_off,
            HEAD_DIM, PAGE_SIZE, NUM_KV_HEADS * HEAD_DIM, BLOCK_G, BLOCK_D, BLOCK_N, False, C8)
        o = acc / l_i[:, None]
        if C8:
            o = o * v_channel[None, :]
        o_off = row * stride_out_tok + heads[:, None] * stride_out_head + d[None, :]
        mask = head_mask[:, None] & d_mask[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, ext_start_ptr, ext_pages_ptr, ext_count_ptr,
    seq_lens_ptr, query_start_ptr, seq_ids_ptr, out_ptr, k_scale_ptr, v_scale_ptr, scale,
    num_items, num_q_blocks, stride_q_tok, stride_q_head, stride_out_tok, stride_out_head,
    stride_ext, GROUP: tl.constexpr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, C8: tl.constexpr,
):
    """A prefill chunk: item = (sequence, block of BLOCK_M query rows, query head), causal.

    C8: int8 pages with fp32 [NUM_KV_HEADS, HEAD_DIM] scales at k/v_scale_ptr (else unused)."""
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_mask = d < HEAD_DIM
    tile_off = n[:, None] * (NUM_KV_HEADS * HEAD_DIM) + d[None, :]
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        head = item % NUM_HEADS
        q_block = (item // NUM_HEADS) % num_q_blocks
        seq = tl.load(seq_ids_ptr + item // (NUM_HEADS * num_q_blocks))
        q_start = tl.load(query_start_ptr + seq)
        q_len = tl.load(query_start_ptr + seq + 1) - q_start
        if q_block * BLOCK_M < q_len:
            seq_len = tl.load(seq_lens_ptr + seq)
            offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
            row_valid = offs_m < q_len
            rows = (q_start + offs_m).to(tl.int64)
            kv_head = head // GROUP
            q = tl.load(
                q_ptr + rows[:, None] * stride_q_tok + head * stride_q_head + d[None, :],
                mask=row_valid[:, None] & d_mask[None, :],
                other=0.0,
            )
            if C8:
                k_channel, v_channel = _channel_scales(k_scale_ptr, v_scale_ptr, kv_head, d,
                                                       d_mask, HEAD_DIM)
                q = (q.to(tl.float32) * k_channel[None, :]).to(q_ptr.dtype.element_ty)
            pos_m = seq_len - q_len + offs_m  # each query row's position in its context
            # causal: no row of this block sees past the block's last row
            hi = tl.minimum(seq_len, seq_len - q_len + (q_block + 1) * BLOCK_M)
            _, l_i, acc = _attend_extents(
                q, pos_m, hi, seq, kv_head, k_cache_ptr, v_cache_ptr, ext_start_ptr,
                ext_pages_ptr, ext_count_ptr, scale, stride_ext, n, d_mask, tile_off, HEAD_DIM,
                PAGE_SIZE, NUM_KV_HEADS * HEAD_DIM, BLOCK_M, BLOCK_D, BLOCK_N, True, C8)
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
