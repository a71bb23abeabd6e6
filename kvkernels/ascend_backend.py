"""The `ascend` backend: kvlab's own Triton kernels for Ascend NPUs (triton-ascend).

- write_kv: reshape-and-cache, one token per work item (kvkernels/ascend_kernels.py).
- paged_attention: decodes (one new token) and prefill chunks as two kernels over an extent
  table of the block tables (kvkernels/extents.py), so dynamic block sizes (runs of 2^k pages)
  and contiguous regions are read as long DMA runs; GQA; page sizes 16..512, multiples of 16.
- copy_pages: one kernel launch when no page is both read and written, else a gather into a
  staging buffer and a scatter from it (copy-on-write chains copy the old content).
- swap_pages: gather the pages into one contiguous staging buffer on the source side, move it
  with one transfer, scatter on the destination side; a host side uses torch index copies.
- kv_cache_dtype int8 (vLLM-Ascend's C8): write_kv quantizes with kvkernels/kv_quant.py's code
  (the reference's bytes) and its kernel scatters the int8 rows; attention loads int8 tiles and
  dequantizes in-kernel with the layer's per-channel scales (kvkernels/ascend_kernels.py); copies
  and swaps move int8 pages as they are. CANN's own attention takes int8 pages of a multiple of
  32 tokens only: these kernels take every page size they take for float pages, and warn
  (KvlabWarning, as specs/block_rules.py does for the simulator) where vLLM-Ascend would not.

Tile sizes per page size are kvkernels/ascend_tiles.py's. Runs on an Ascend NPU with triton-ascend
and CANN (unverified on hardware: compiled here only up to bishengir's last, CANN-only step),
and on CPU tensors under TRITON_INTERPRET=1, where it is tested against the torch reference.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch import Tensor

from kvlab.errors import KvlabError, KvlabWarning
from kvlab.kernels import ascend_kernels as k
from kvlab.kernels.ascend_tiles import (
    ASCEND910B3_AI_CORES,
    ASCEND910B3_VECTOR_CORES,
    CANN_INT8_PAGE_SIZE_MULTIPLE,
    MAX_PAGE_SIZE,
    MIN_PAGE_SIZE,
    attention_tiles,
    decode_constants,
    move_pages_constants,
    num_programs,
    prefill_constants,
    write_kv_constants,
)
from kvlab.kernels.backend import AttentionCall, KernelBackend, KVRows, refuse_unless_c8
from kvlab.kernels.extents import ExtentTable, build_extents
from kvlab.kernels.kv_quant import KVQuant
from kvlab.kernels.launch import check_cache_pair, seq_ids_tensor, split_batch
from kvlab.kernels.metadata import AttentionMetadata

# triton-ascend has no fp64 and no fp8 arithmetic on the vector cores
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
C8_DTYPE = torch.int8  # pages of kv_cache_dtype int8


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def has_triton_ascend() -> bool:
    """True when the installed Triton is triton-ascend (it ships an `ascend` backend)."""
    return importlib.util.find_spec("triton.backends.ascend") is not None


def check_ascend_cache(page_size: int, dtype: torch.dtype) -> None:
    """Raise KvlabError unless the ascend kernels take caches of this page size and dtype
    (float pages, or int8 pages of kv_cache_dtype int8)."""
    if dtype not in (*SUPPORTED_DTYPES, C8_DTYPE):
        raise KvlabError(
            f"the ascend backend's kernels take float16, bfloat16 or float32 caches, not {dtype} "
            "(triton-ascend has no fp64 or fp8 arithmetic), or int8 ones (kv_cache_dtype "
            "int8); choose another --dtype"
        )
    if not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE or page_size % MIN_PAGE_SIZE:
        raise KvlabError(
            f"page size (--block-size) {page_size} does not suit the ascend backend: expected a "
            f"multiple of {MIN_PAGE_SIZE} from {MIN_PAGE_SIZE} to {MAX_PAGE_SIZE} (128 is what "
            "vLLM-Ascend uses)"
        )



@functools.cache
def warn_c8_page_size(page_size: int) -> None:
    """Say once per page size that CANN's attention would refuse these int8 pages."""
    if page_size % CANN_INT8_PAGE_SIZE_MULTIPLE:
        warnings.warn(
            f"block_size {page_size}: Ascend's fused attention (CANN) needs a multiple of "
            f"{CANN_INT8_PAGE_SIZE_MULTIPLE} of at most {MAX_PAGE_SIZE} with an int8 KV cache; "
            "the ascend backend's own kernels run it, vLLM-Ascend would not",
            KvlabWarning, stacklevel=4)


class AscendBackend(KernelBackend):
    """triton-ascend kernels on an Ascend NPU; on CPU tensors under Triton's interpreter."""

    name = "ascend"
    supports_sliding_window = False
    kv_cache_dtypes = ("auto", "int8")  # and bfloat16/float16 where the model runs in it

    def __init__(self) -> None:
        self._last_extents: tuple[AttentionMetadata, ExtentTable] | None = None

    def check_device(self, device: torch.device) -> None:
        """A KvlabError when these kernels cannot run on `device` in this environment."""
        if device.type == "cpu" and not interpreting():
            raise KvlabError(
                "attention_backend ascend on cpu needs Triton's interpreter: start kvlab with "
                "TRITON_INTERPRET=1 in the environment (slow; for checking kernels), or use "
                "attention_backend torch",
                parameters=("attention_backend",),
            )
        if device.type == "npu" and not has_triton_ascend():
            raise KvlabError(
                "attention_backend ascend on npu needs triton-ascend (pip install "
                "triton-ascend, in an environment without the plain triton package)",
                parameters=("attention_backend",),
            )

    def _write_kv(self, rows: KVRows) -> None:
        """Rows quantized by `kv_quant` (int8, C8: kv_quant.py's torch code, so the stored bytes
        are the reference's) and scattered by the kernel; None: cast to the cache's dtype there."""
        k_cache, v_cache = rows.k_cache, rows.v_cache
        _check_pages(k_cache, v_cache, rows.kv_quant)
        num_tokens = rows.key.shape[0]
        if num_tokens == 0:
            return
        key, value = rows.stored()
        assert key.stride(-1) == 1 and value.stride(-1) == 1, "head_dim must be contiguous"
        num_kv_heads, head_dim = k_cache.shape[2:]
        k.write_kv_kernel[(num_programs(num_tokens, _vector_cores(key.device)),)](
            key,
            value,
            k_cache,
            v_cache,
            rows.slot_mapping,
            num_tokens,
            key.stride(0),
            key.stride(1),
            value.stride(0),
            value.stride(1),
            **write_kv_constants(num_kv_heads, head_dim),
        )

    def _paged_attention(self, call: AttentionCall) -> Tensor:
        """The decode and prefill kernels over the batch's extent table (full attention only);
        int8 pages (`kv_quant`, C8) are dequantized in the kernels with the layer's
        per-channel scales."""
        _check_pages(call.k_cache, call.v_cache, call.kv_quant)
        assert call.k_cache.shape[1] == call.meta.page_size, (
            "cache pages must hold meta.page_size slots")
        assert call.query.stride(-1) == 1, "head_dim must be contiguous"
        out = torch.empty_like(call.query) if call.out is None else call.out
        batch = _Batch(call, _KVPages.of(call.k_cache, call.v_cache, call.kv_quant),
                       self._extents(call.meta), out)
        decode_ids, prefill_ids = split_batch(call.meta)
        if decode_ids:
            _decode(batch, decode_ids)
        if prefill_ids:
            _prefill(batch, prefill_ids)
        return out

    def _extents(self, meta: AttentionMetadata) -> ExtentTable:
        """The batch's extent table, built once per step: every layer gets the same metadata
        object, which nothing changes after AttentionMetadata.build."""
        if self._last_extents is None or self._last_extents[0] is not meta:
            self._last_extents = (
                meta,
                build_extents(meta.block_tables, meta.seq_lens, meta.page_size),
            )
        return self._last_extents[1]

    def copy_pages(self, k_cache: Tensor, v_cache: Tensor, pairs: Tensor) -> None:
        """One move kernel; through a staging buffer where a page is both read and written."""
        _check_caches(k_cache, v_cache)
        if pairs.shape[0] == 0:
            return
        pairs = pairs.to(k_cache.device, torch.int64)
        src_ids, dst_ids = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
        if not bool(torch.isin(dst_ids, src_ids).any()):
            _move_pages((k_cache, v_cache), (k_cache, v_cache), src_ids, dst_ids)
            return
        # a page both read and written would race between programs: stage the sources first
        stage = _staging(k_cache, pairs.shape[0], k_cache.device)
        order = torch.arange(pairs.shape[0], device=k_cache.device)
        _move_pages((k_cache, v_cache), stage, src_ids, order)
        _move_pages(stage, (k_cache, v_cache), order, dst_ids)

    def swap_pages(
        self, src_k: Tensor, src_v: Tensor, dst_k: Tensor, dst_v: Tensor, pairs: Tensor
    ) -> None:
        """Gather into a staging buffer, one transfer, scatter (host sides by the CPU)."""
        _check_caches(src_k, src_v)
        _check_caches(dst_k, dst_v)
        assert src_k.shape[1:] == dst_k.shape[1:], "both caches need the same page shape"
        if pairs.shape[0] == 0:
            return
        num_pairs = pairs.shape[0]
        order_src = torch.arange(num_pairs, device=src_k.device)
        stage = _staging(src_k, num_pairs, src_k.device)
        _gather_or_index(
            (src_k, src_v), stage, pairs[:, 0].to(src_k.device, torch.int64), order_src
        )
        # the one transfer between the two sides (host <-> device)
        moved = (stage[0].to(dst_k.device, dst_k.dtype), stage[1].to(dst_k.device, dst_k.dtype))
        order_dst = torch.arange(num_pairs, device=dst_k.device)
        _gather_or_index(
            moved, (dst_k, dst_v), order_dst, pairs[:, 1].to(dst_k.device, torch.int64)
        )


@dataclass(frozen=True, slots=True)
class _KVPages:
    """A layer's K/V pages as the attention kernels take them: the caches, the C8 scales
    (float pages pass their caches in their place, unused) and whether they are int8."""

    k_cache: Tensor
    v_cache: Tensor
    k_scale: Tensor
    v_scale: Tensor
    c8: bool

    @staticmethod
    def of(k_cache: Tensor, v_cache: Tensor, kv_quant: KVQuant | None) -> _KVPages:
        if kv_quant is None:
            return _KVPages(k_cache, v_cache, k_cache, v_cache, c8=False)
        k_scale, v_scale = kv_quant.channel_scale("k"), kv_quant.channel_scale("v")
        assert k_scale is not None and v_scale is not None, "C8 comes with channel scales"
        shape = (k_cache.shape[2], kv_quant.head_dim)
        assert k_scale.shape == shape and v_scale.shape == shape, "scales: [kv_heads, head_dim]"
        return _KVPages(k_cache, v_cache, _fp32(k_scale, k_cache.device),
                        _fp32(v_scale, k_cache.device), c8=True)


def _fp32(scale: Tensor, device: torch.device) -> Tensor:
    """Contiguous fp32 channel scales on the caches' device (a no-op for the engine's)."""
    return scale.to(device, torch.float32).contiguous()


@dataclass(frozen=True, slots=True)
class _Batch:
    """What every attention launch of one paged_attention call shares."""

    call: AttentionCall
    kv: _KVPages
    extents: ExtentTable
    out: Tensor


def _decode(batch: _Batch, seq_ids: list[int]) -> None:
    """Launch the decode kernel over the sequences with one new token."""
    num_heads, head_dim = batch.call.query.shape[1:]
    num_kv_heads = batch.kv.k_cache.shape[2]
    constants = decode_constants(batch.call.meta.page_size, num_heads, num_kv_heads, head_dim,
                                 batch.kv.c8)
    _attend(k.decode_kernel, batch, seq_ids, (len(seq_ids) * num_kv_heads,), constants)


def _prefill(batch: _Batch, seq_ids: list[int]) -> None:
    """Launch the prefill-chunk kernel over the sequences with more than one new token."""
    num_heads, head_dim = batch.call.query.shape[1:]
    num_kv_heads = batch.kv.k_cache.shape[2]
    tiles = attention_tiles(batch.call.meta.page_size, head_dim, num_heads // num_kv_heads)
    max_query_len = max(batch.call.meta.query_lens_cpu[i] for i in seq_ids)
    num_q_blocks = triton.cdiv(max_query_len, tiles.query_rows)
    constants = prefill_constants(batch.call.meta.page_size, num_heads, num_kv_heads, head_dim,
                                  batch.kv.c8)
    _attend(k.prefill_kernel, batch, seq_ids,
            (len(seq_ids) * num_q_blocks * num_heads, num_q_blocks), constants)


def _attend(kernel: Any, batch: _Batch, seq_ids: list[int], counts: tuple[int, ...],
            constants: dict[str, int]) -> None:
    """Launch an attention kernel over `seq_ids`, one program per AI core at most; `counts`:
    its work items, then its other counts (the kernels' arguments after `scale`)."""
    query, meta, kv, extents = batch.call.query, batch.call.meta, batch.kv, batch.extents
    out = batch.out
    kernel[(num_programs(counts[0], _ai_cores(query.device)),)](
        query, kv.k_cache, kv.v_cache, extents.start_pages, extents.num_pages,
        extents.num_extents, meta.seq_lens, meta.query_start_loc,
        seq_ids_tensor(seq_ids, meta.num_seqs, query.device), out, kv.k_scale, kv.v_scale,
        batch.call.scale, *counts, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        extents.start_pages.stride(0), **constants,
    )


def _move_pages(
    src: tuple[Tensor, Tensor], dst: tuple[Tensor, Tensor], src_ids: Tensor, dst_ids: Tensor
) -> None:
    """Page src_ids[i] of the src K/V pair -> page dst_ids[i] of the dst pair, one launch."""
    constants = move_pages_constants(src[0][0].numel())
    num_items = src_ids.shape[0] * constants["NUM_CHUNKS"]
    k.move_pages_kernel[(num_programs(num_items, _vector_cores(src[0].device)),)](
        src[0],
        src[1],
        dst[0],
        dst[1],
        src_ids,
        dst_ids,
        num_items,
        **constants,
    )


def _gather_or_index(
    src: tuple[Tensor, Tensor], dst: tuple[Tensor, Tensor], src_ids: Tensor, dst_ids: Tensor
) -> None:
    """Move pages with the kernel where both sides are kernel memory, else torch index copies."""
    if _kernel_memory(src[0]) and _kernel_memory(dst[0]):
        _move_pages(src, dst, src_ids.contiguous(), dst_ids.contiguous())
        return
    for s, d in zip(src, dst, strict=True):  # host pages: the CPU copies them
        d.index_copy_(0, dst_ids, s.index_select(0, src_ids))


def _staging(like: Tensor, num_pages: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Two contiguous `[num_pages, *page_shape]` buffers for K and V pages in transit."""
    shape = (num_pages, *like.shape[1:])
    # host staging is page-locked where an accelerator copies it by DMA, never elsewhere
    pin = device.type == "cpu" and torch.accelerator.is_available()
    return (
        torch.empty(shape, dtype=like.dtype, device=device, pin_memory=pin),
        torch.empty(shape, dtype=like.dtype, device=device, pin_memory=pin),
    )


def _kernel_memory(t: Tensor) -> bool:
    """True when a Triton kernel can address `t`: device memory, or any memory when interpreting."""
    return t.device.type != "cpu" or interpreting()


def _ai_cores(device: torch.device) -> int:
    """AI cores (Cube + Vector) of the device; the 910B3's count where no driver says."""
    return _device_cores(device, "num_aicore", ASCEND910B3_AI_CORES)


def _vector_cores(device: torch.device) -> int:
    """Vector cores of the device; the 910B3's count where no driver says."""
    return _device_cores(device, "num_vectorcore", ASCEND910B3_VECTOR_CORES)


def _device_cores(device: torch.device, key: str, default: int) -> int:
    if device.type != "npu":
        return default
    from triton.runtime import driver  # triton-ascend's NPU driver: present only with CANN

    properties = driver.active.utils.get_device_properties(device.index or 0)
    return int(properties.get(key, default))


def _check_pages(k_cache: Tensor, v_cache: Tensor, kv_quant: KVQuant | None) -> None:
    """_check_caches, and for writes and attention: C8 only, int8 pages with a KVQuant and
    float pages without, and the warning for int8 pages CANN would refuse."""
    refuse_unless_c8(AscendBackend.name, kv_quant)
    _check_caches(k_cache, v_cache)
    assert (k_cache.dtype == C8_DTYPE) == (kv_quant is not None), (
        "int8 pages come with their KVQuant (C8 scales), float pages without")
    if kv_quant is not None:
        warn_c8_page_size(k_cache.shape[1])


def _check_caches(k_cache: Tensor, v_cache: Tensor) -> None:
    """Page size and dtype (check_ascend_cache) and layout of a K/V cache pair."""
    check_ascend_cache(k_cache.shape[1], k_cache.dtype)
    check_cache_pair(k_cache, v_cache)
    assert k_cache.dtype == v_cache.dtype, "K and V caches must have the same dtype"
