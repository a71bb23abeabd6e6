"""A torch emulation of the torch_npu ops the npu backend calls, for tests on machines without NPUs.

Each function follows the documented contract of the op of the same name (torch_npu 2.13 docs,
Ascend/op-plugin docs/context/*.md): argument names, layouts, dtypes, cumulative query ends vs
per-sequence KV lengths in the TND layout, the fixed 2048 x 2048 mask of sparse_mode=3, in-place
cache updates. It checks what the docs require of callers and raises ContractError when a caller
breaks it, then computes the documented result with plain fp32 torch. Only the configurations the
backend uses are emulated; others raise NotImplementedError rather than guess.

`fake_torch_npu()` returns a module to place in sys.modules["torch_npu"]; `calls` on it records
which op ran, so tests can tell the decode fast path from the fused one.
"""

from __future__ import annotations

import importlib.machinery
import types

import torch
import torch.nn.functional as F
from torch import Tensor

_HALF_DTYPES = (torch.float16, torch.bfloat16)
_MASK_SIZE = 2048


class ContractError(AssertionError):
    """The caller broke a documented requirement of the emulated op."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ContractError(message)


def _check_paged_cache(op: str, key: Tensor, value: Tensor, block_size: int) -> None:
    _require(key.shape == value.shape, f"{op}: key and value caches differ in shape")
    _require(key.dtype in _HALF_DTYPES, f"{op}: caches must be float16/bfloat16, not {key.dtype}")
    _require(
        0 < block_size <= 512 and block_size % 16 == 0,
        f"{op}: block_size {block_size} must be a multiple of 16 and at most 512",
    )


def _gather(cache: Tensor, table: Tensor, length: int, num_kv_heads: int) -> Tensor:
    """The first `length` tokens of one sequence, [length, num_kv_heads, head_dim], as fp32."""
    block_size = cache.shape[1]
    pages = table[: -(-length // block_size)].long()
    return cache[pages].reshape(-1, num_kv_heads, cache.shape[-1] // num_kv_heads)[:length].float()


def _attend(q: Tensor, k: Tensor, v: Tensor, scale: float, visible: Tensor) -> Tensor:
    """Softmax attention in fp32; q [n, heads, dim], k/v [s, kv_heads, dim], visible [n, s]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.float(), k) * scale
    probs = F.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hns,shd->nhd", probs, v)


def npu_scatter_pa_kv_cache(
    key: Tensor,
    value: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    slot_mapping: Tensor,
    *,
    compress_lens: Tensor | None = None,
    compress_seq_offsets: Tensor | None = None,
    seq_lens: Tensor | None = None,
    cache_mode: str | None = "PA_NZ",
) -> None:
    """Write each token's key/value at its slot of ND caches, in place (scenario: 3-D key)."""
    op = "npu_scatter_pa_kv_cache"
    if cache_mode not in (None, "Norm"):
        raise NotImplementedError(f"{op}: only ND caches (cache_mode='Norm') are emulated")
    if compress_lens is not None or compress_seq_offsets is not None or seq_lens is not None:
        raise NotImplementedError(f"{op}: the compression scenario is not emulated")
    _require(key.dim() == 3 and value.dim() == 3, f"{op}: key/value must be [tokens, heads, dim]")
    _require(key.shape[:2] == value.shape[:2], f"{op}: key and value differ in tokens or heads")
    _require(key_cache.dim() == 4, f"{op}: caches must be [blocks, block_size, heads, dim]")
    _require(key_cache.shape[2:] == key.shape[1:], f"{op}: cache heads/dim differ from key's")
    for t in (key, value, key_cache, value_cache, slot_mapping):
        _require(t.is_contiguous(), f"{op}: non-contiguous inputs are not supported")
    _require(
        key.dtype == value.dtype == key_cache.dtype == value_cache.dtype,
        f"{op}: key, value and caches must share one dtype",
    )
    _require(slot_mapping.dtype in (torch.int32, torch.int64), f"{op}: slot_mapping int32/int64")
    _require(slot_mapping.shape == key.shape[:1], f"{op}: one slot per token")
    slots = slot_mapping.long()
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    _require(
        bool(((slots >= 0) & (slots < num_slots)).all()),
        f"{op}: slot_mapping values must lie in [0, {num_slots - 1}]",
    )
    _require(slots.unique().numel() == slots.numel(), f"{op}: slot_mapping values must be unique")
    key_cache.view(num_slots, *key_cache.shape[2:])[slots] = key
    value_cache.view(num_slots, *value_cache.shape[2:])[slots] = value


def npu_fused_infer_attention_score(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    atten_mask: Tensor | None = None,
    actual_seq_lengths: list[int] | None = None,
    actual_seq_lengths_kv: list[int] | None = None,
    block_table: Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    block_size: int = 0,
    softmax_lse_flag: bool = False,
    key_antiquant_scale: Tensor | None = None,
    key_antiquant_offset: Tensor | None = None,
    value_antiquant_scale: Tensor | None = None,
    value_antiquant_offset: Tensor | None = None,
    key_antiquant_mode: int = 0,
    value_antiquant_mode: int = 0,
    **other: object,
) -> tuple[Tensor, Tensor]:
    """Attention in three configurations: paged TND (sparse_mode 0 unmasked or 3 causal);
    paged BNSD decodes over int8 caches with per-channel antiquant (C8); dense TND (no
    block_table: K/V given per token, KV lengths cumulative, sparse_mode 3)."""
    op = "npu_fused_infer_attention_score"
    if other or softmax_lse_flag or key_antiquant_mode or value_antiquant_mode:
        raise NotImplementedError(f"{op}: only the default extras and antiquant mode 0 emulated")
    antiquant = (key_antiquant_scale, key_antiquant_offset, value_antiquant_scale,
                 value_antiquant_offset)
    num_kv_heads = num_key_value_heads or num_heads
    if input_layout == "BNSD":
        return _bnsd_int8_decode(op, query, key, value, antiquant, actual_seq_lengths_kv,
                                 block_table, num_heads, num_kv_heads, scale, sparse_mode,
                                 block_size, atten_mask), torch.zeros(1)
    _require(all(t is None for t in antiquant), f"{op}: antiquant is emulated in BNSD only")
    if input_layout != "TND":
        raise NotImplementedError(f"{op}: only the TND and BNSD layouts are emulated")
    if block_table is None:
        return _dense_tnd(op, query, key, value, atten_mask, actual_seq_lengths,
                          actual_seq_lengths_kv, num_heads, num_kv_heads, scale,
                          sparse_mode), torch.zeros(1)
    if sparse_mode not in (0, 3):
        raise NotImplementedError(f"{op}: only sparse_mode 0 and 3 are emulated")
    _require(query.dim() == 3 and query.shape[1] == num_heads, f"{op}: query must be [T, N, D]")
    _require(query.is_contiguous(), f"{op}: query must be contiguous")
    _require(query.dtype == key.dtype, f"{op}: query and caches must share one dtype")
    _require(key.dim() == 3, f"{op}: paged key/value emulated as [blocks, block_size, H] only")
    _require(block_size == key.shape[1], f"{op}: block_size must equal the caches' dim 1")
    _check_paged_cache(op, key, value, block_size)
    _require(num_heads % num_kv_heads == 0, f"{op}: num_heads must divide by num_key_value_heads")
    _require(num_heads // num_kv_heads <= 64, f"{op}: at most 64 query heads per KV head")
    _require(key.shape[2] == num_kv_heads * query.shape[2], f"{op}: H must be KV_N * D")
    q_ends, kv_lens = _check_lengths(op, query, actual_seq_lengths, actual_seq_lengths_kv)
    _require(block_table.dtype == torch.int32, f"{op}: block_table must be int32")
    _require(block_table.dim() == 2 and block_table.shape[0] == len(q_ends), f"{op}: [B, M]")
    max_blocks = -(-max(kv_lens, default=0) // block_size)
    _require(block_table.shape[1] >= max_blocks, f"{op}: block_table narrower than the contexts")
    if sparse_mode == 3:
        _check_compressed_causal_mask(op, atten_mask)
    else:
        _require(atten_mask is None, f"{op}: sparse_mode 0 is emulated without a mask only")
    out = torch.zeros_like(query)
    start = 0
    for b, (end, kv_len) in enumerate(zip(q_ends, kv_lens, strict=True)):
        q_len = end - start
        _require(q_len <= kv_len, f"{op}: batch {b} has more query tokens than KV tokens")
        k = _gather(key, block_table[b], kv_len, num_kv_heads)
        v = _gather(value, block_table[b], kv_len, num_kv_heads)
        visible = torch.ones(q_len, kv_len, dtype=torch.bool)
        if sparse_mode == 3:  # rightDownCausal: the last query row sees the whole context
            rows = torch.arange(q_len)[:, None] + (kv_len - q_len)
            visible = torch.arange(kv_len)[None, :] <= rows
        out[start:end] = _attend(query[start:end], k, v, scale, visible).to(query.dtype)
        start = end
    return out, torch.zeros(1)


def _bnsd_int8_decode(op: str, query: Tensor, key: Tensor, value: Tensor,
                      antiquant: tuple[Tensor | None, ...], kv_lens: list[int] | None,
                      block_table: Tensor | None, num_heads: int, num_kv_heads: int,
                      scale: float, sparse_mode: int, block_size: int,
                      atten_mask: Tensor | None) -> Tensor:
    """BNSD decodes (S = 1) over int8 pages [blocks, block_size, KV_N * D], dequantized per
    channel: (int8 - offset) * scale, scale and offset shaped (1, KV_N, 1, D)."""
    _require(query.dim() == 4 and query.shape[1] == num_heads and query.shape[2] == 1,
             f"{op}: BNSD decodes emulated as query [B, N, 1, D] only")
    _require(query.dtype in _HALF_DTYPES and query.is_contiguous(), f"{op}: query fp16/bf16")
    _require(key.dtype == value.dtype == torch.int8, f"{op}: BNSD emulated over int8 caches")
    _require(key.dim() == 3 and key.shape == value.shape, f"{op}: caches [blocks, bs, H]")
    _require(block_table is not None and block_table.dtype == torch.int32,
             f"{op}: block_table int32 required")
    _require(block_size == key.shape[1] and block_size % 32 == 0 and block_size <= 512,
             f"{op}: int8 caches need block_size a multiple of 32 up to 512")
    _require(sparse_mode == 0 and atten_mask is None, f"{op}: decodes take no mask")
    head_dim = query.shape[3]
    _require(key.shape[2] == num_kv_heads * head_dim, f"{op}: H must be KV_N * D")
    shape = (1, num_kv_heads, 1, head_dim)
    for tensor in antiquant:
        _require(tensor is not None and tuple(tensor.shape) == shape,
                 f"{op}: per-channel antiquant scale/offset must be {shape}")
        _require(tensor.dtype == query.dtype, f"{op}: antiquant tensors in the query's dtype")
    _require(kv_lens is not None and len(kv_lens) == query.shape[0],
             f"{op}: one KV length per batch")
    k_scale, k_offset, v_scale, v_offset = (t.float().view(num_kv_heads, head_dim)
                                            for t in antiquant)  # type: ignore[union-attr]
    out = torch.zeros_like(query)
    for b, length in enumerate(kv_lens):
        k = (_gather(key, block_table[b], length, num_kv_heads) - k_offset) * k_scale
        v = (_gather(value, block_table[b], length, num_kv_heads) - v_offset) * v_scale
        visible = torch.ones(1, length, dtype=torch.bool)
        out[b, :, 0] = _attend(query[b, :, 0][None], k, v, scale, visible)[0].to(query.dtype)
    return out


def _dense_tnd(op: str, query: Tensor, key: Tensor, value: Tensor, atten_mask: Tensor | None,
               q_ends: list[int] | None, kv_ends: list[int] | None, num_heads: int,
               num_kv_heads: int, scale: float, sparse_mode: int) -> Tensor:
    """TND over K/V given per token ([T_kv, KV_N, D]); both length lists cumulative."""
    _require(query.dim() == 3 and query.shape[1] == num_heads, f"{op}: query must be [T, N, D]")
    _require(key.dim() == 3 and key.shape == value.shape and key.shape[1] == num_kv_heads,
             f"{op}: dense key/value must be [T, KV_N, D]")
    _require(query.dtype == key.dtype == value.dtype, f"{op}: one dtype for q, k, v")
    _require(sparse_mode == 3, f"{op}: dense TND emulated with sparse_mode 3 only")
    _check_compressed_causal_mask(op, atten_mask)
    q_ends, kv_ends = _check_lengths(op, query, q_ends, kv_ends)
    _require(all(b >= a for a, b in zip([0, *kv_ends], kv_ends, strict=False)),
             f"{op}: actual_seq_lengths_kv must be cumulative in dense TND")
    _require(not kv_ends or kv_ends[-1] <= key.shape[0], f"{op}: KV ends exceed T_kv")
    out = torch.zeros_like(query)
    q_start = kv_start = 0
    for q_end, kv_end in zip(q_ends, kv_ends, strict=True):
        q_len, kv_len = q_end - q_start, kv_end - kv_start
        _require(q_len <= kv_len, f"{op}: more query tokens than KV tokens")
        rows = torch.arange(q_len)[:, None] + (kv_len - q_len)
        visible = torch.arange(kv_len)[None, :] <= rows
        out[q_start:q_end] = _attend(query[q_start:q_end], key[kv_start:kv_end].float(),
                                     value[kv_start:kv_end].float(), scale,
                                     visible).to(query.dtype)
        q_start, kv_start = q_end, kv_end
    return out


def _check_lengths(
    op: str, query: Tensor, q_ends: list[int] | None, kv_lens: list[int] | None
) -> tuple[list[int], list[int]]:
    """TND: both lists required, one entry per batch; query lengths are cumulative ends."""
    _require(q_ends is not None and kv_lens is not None, f"{op}: TND needs both length lists")
    q_ends, kv_lens = list(q_ends), list(kv_lens)
    _require(len(q_ends) == len(kv_lens), f"{op}: one query end and one KV length per batch")
    _require(
        all(b >= a for a, b in zip([0, *q_ends], q_ends, strict=False)),
        f"{op}: actual_seq_lengths must be cumulative (non-decreasing, from 0) in TND",
    )
    _require(not q_ends or q_ends[-1] <= query.shape[0], f"{op}: query ends exceed T")
    _require(all(n >= 0 for n in kv_lens), f"{op}: negative actual_seq_lengths_kv")
    return q_ends, kv_lens


def _check_compressed_causal_mask(op: str, mask: Tensor | None) -> None:
    _require(mask is not None, f"{op}: sparse_mode 3 needs the 2048 x 2048 atten_mask")
    _require(
        mask.shape[-2:] == (_MASK_SIZE, _MASK_SIZE) and mask.numel() == _MASK_SIZE**2,
        f"{op}: sparse_mode 3 needs atten_mask of shape (2048, 2048), got {tuple(mask.shape)}",
    )
    _require(mask.dtype in (torch.bool, torch.int8, torch.uint8), f"{op}: mask bool/int8/uint8")
    expected = torch.ones(_MASK_SIZE, _MASK_SIZE, dtype=torch.bool).triu(diagonal=1)
    _require(
        torch.equal(mask.reshape(_MASK_SIZE, _MASK_SIZE).bool().cpu(), expected),
        f"{op}: sparse_mode 3 needs 1 above the diagonal (masked) and 0 on and below it",
    )


def _npu_paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: Tensor,
    context_lens: Tensor,
    out: Tensor,
) -> None:
    """Decode attention: one query token per sequence over its whole paged context, into out."""
    op = "_npu_paged_attention"
    _require(query.dim() == 3 and query.shape[1] == num_heads, f"{op}: query must be [B, N, D]")
    _require(key_cache.dim() == 4, f"{op}: caches must be [blocks, block_size, KV_N, D]")
    _require(key_cache.shape[2] == num_kv_heads, f"{op}: num_kv_heads differs from the caches")
    _check_paged_cache(op, key_cache, value_cache, key_cache.shape[1])
    _require(query.dtype == key_cache.dtype == out.dtype, f"{op}: one dtype for q, caches, out")
    _require(out.shape == query.shape and out.is_contiguous(), f"{op}: out must be like query")
    _require(block_table.dtype == torch.int32, f"{op}: block_table must be int32")
    _require(
        isinstance(context_lens, Tensor) and context_lens.dtype == torch.int32,
        f"{op}: context_lens must be an int32 tensor",
    )
    _require(context_lens.device.type == "cpu", f"{op}: context_lens must be a host tensor")
    _require(context_lens.shape == query.shape[:1], f"{op}: one context length per query")
    cache_2d = key_cache.view(*key_cache.shape[:2], -1)
    value_2d = value_cache.view(*value_cache.shape[:2], -1)
    for b, length in enumerate(context_lens.tolist()):
        k = _gather(cache_2d, block_table[b], length, num_kv_heads)
        v = _gather(value_2d, block_table[b], length, num_kv_heads)
        visible = torch.ones(1, length, dtype=torch.bool)
        out[b : b + 1] = _attend(query[b : b + 1], k, v, scale_value, visible).to(out.dtype)


def fake_torch_npu() -> types.ModuleType:
    """A stand-in `torch_npu` module whose ops are the emulations above; `calls` logs op names."""
    module = types.ModuleType("torch_npu")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", loader=None)
    calls: list[str] = []
    module.calls = calls

    def logged(fn):
        def wrapper(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)

        return wrapper

    for fn in (npu_scatter_pa_kv_cache, npu_fused_infer_attention_score, _npu_paged_attention):
        setattr(module, fn.__name__, logged(fn))
    return module


# kvlab's own AscendC ops (kvkernels/ascendc/torch_ops.cpp), emulated from their schema and the
# rules their kernels rely on: what the torch op checks, plus the tiling contract the kernels
# trust (UB fit, tiles dividing pages, at most 16 query heads per KV head).
_UB_BYTES = 192 * 1024
_VECTOR_CORES = 40


class FakeAscendcOps:
    """A stand-in for `torch.ops.kvlab_ascendc`; `calls` logs which op ran."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.num_runs: list[int] = []  # runs per swap_pages call

    def copy_pages(
        self, dst_k, dst_v, src_k, src_v, src_ids, dst_ids, tile_elems, buffer_num, block_dim
    ) -> None:
        op = "kvlab_ascendc::copy_pages"
        self.calls.append("copy_pages")
        for cache in (dst_k, dst_v, src_k, src_v):
            _require(cache.dtype in _HALF_DTYPES, f"{op}: caches must be float16/bfloat16")
            _require(cache.is_contiguous(), f"{op}: caches must be contiguous")
        _require(src_k.shape[1:] == dst_k.shape[1:], f"{op}: page shapes differ")
        _require(src_ids.dtype == dst_ids.dtype == torch.int64, f"{op}: page ids must be int64")
        _require(src_ids.numel() == dst_ids.numel(), f"{op}: one destination per source page")
        page_elems = src_k[0].numel()
        _require(page_elems % tile_elems == 0, f"{op}: a page must be whole tiles")
        _require(tile_elems * src_k.element_size() % 32 == 0, f"{op}: tiles of 32-byte blocks")
        _require(
            tile_elems * src_k.element_size() * buffer_num <= _UB_BYTES, f"{op}: tiles overflow UB"
        )
        _require(1 <= block_dim <= _VECTOR_CORES, f"{op}: block_dim {block_dim} cores")
        if src_k.data_ptr() == dst_k.data_ptr():  # cores race on a page both read and written
            _require(
                not bool(torch.isin(dst_ids, src_ids).any()),
                f"{op}: sources and destinations overlap",
            )
        for src, dst in ((src_k, dst_k), (src_v, dst_v)):
            dst[dst_ids] = src[src_ids]

    def paged_decode(
        self,
        out,
        query,
        k_cache,
        v_cache,
        ext_start,
        ext_pages,
        ext_count,
        seq_lens,
        scale,
        tile_tokens,
        buffer_num,
        block_dim,
    ) -> None:
        op = "kvlab_ascendc::paged_decode"
        self.calls.append("paged_decode")
        _require(query.dim() == 3 and query.is_contiguous(), f"{op}: query [seqs, heads, dim]")
        _require(k_cache.dim() == 4 and k_cache.is_contiguous(), f"{op}: caches 4-D contiguous")
        _require(out.shape == query.shape and out.is_contiguous(), f"{op}: out must be like query")
        _require(query.dtype == k_cache.dtype, f"{op}: query and caches: one dtype")
        _require(k_cache.dtype in _HALF_DTYPES, f"{op}: caches must be float16/bfloat16")
        for t in (ext_start, ext_pages, ext_count, seq_lens):
            _require(t.dtype == torch.int32 and t.is_contiguous(), f"{op}: tables must be int32")
        num_kv_heads, head_dim = k_cache.shape[2:]
        group = query.shape[1] // num_kv_heads
        _require(1 <= group <= 16, f"{op}: at most 16 query heads per KV head")
        _require(k_cache.shape[1] % tile_tokens == 0, f"{op}: a tile must divide the page")
        _require(buffer_num == 2 and 1 <= block_dim <= _VECTOR_CORES, f"{op}: launch arguments")
        page_size = k_cache.shape[1]
        for seq in range(query.shape[0]):
            count = int(ext_count[seq])
            pages = torch.cat(
                [
                    torch.arange(int(first), int(first) + int(n))
                    for first, n in zip(ext_start[seq, :count], ext_pages[seq, :count], strict=True)
                ]
            )
            length = int(seq_lens[seq])
            _require(len(pages) * page_size >= length, f"{op}: extents shorter than the context")
            k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:length].float()
            v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:length].float()
            visible = torch.ones(1, length, dtype=torch.bool)
            out[seq : seq + 1] = _attend(query[seq : seq + 1], k, v, scale, visible).to(out.dtype)

    def swap_pages(self, src_k, src_v, dst_k, dst_v, src_offsets, dst_offsets, sizes) -> None:
        op = "kvlab_ascendc::swap_pages"
        self.calls.append("swap_pages")
        self.num_runs.append(sizes.numel())
        for t in (src_offsets, dst_offsets, sizes):
            _require(t.device.type == "cpu" and t.dtype == torch.int64, f"{op}: host int64 runs")
        _require(src_offsets.shape == dst_offsets.shape == sizes.shape, f"{op}: one row per run")
        for src, dst in ((src_k, dst_k), (src_v, dst_v)):
            src_bytes, dst_bytes = src.view(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
            for s, d, n in zip(
                src_offsets.tolist(), dst_offsets.tolist(), sizes.tolist(), strict=True
            ):
                _require(
                    s + n <= src_bytes.numel() and d + n <= dst_bytes.numel(),
                    f"{op}: run out of range",
                )
                dst_bytes[d : d + n] = src_bytes[s : s + n]
