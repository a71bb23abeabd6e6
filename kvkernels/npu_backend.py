"""Ascend NPU backend: torch_npu's documented fused ops, called the way vllm-ascend calls them.

- write_kv: `npu_scatter_pa_kv_cache(..., cache_mode="Norm")`, the ND cache layout
  `[num_pages, page_size, num_kv_heads, head_dim]`.
- decode-only batches: `_npu_paged_attention` over the block tables, context lengths on the
  host; when kvlab's AscendC kernels are built (kvkernels/ascendc/) and the longest sequence's
  pages come in runs (dynamic block sizes, contiguous regions), kvlab's extent-aware decode.
- any batch with a prefill chunk: `npu_fused_infer_attention_score` in the "TND" layout with
  `sparse_mode=3` (causal aligned to the bottom-right corner, i.e. to the end of each context),
  the caches viewed as `[num_pages, page_size, num_kv_heads * head_dim]`.
- copy_pages and swap_pages: torch_npu has no copy/swap-blocks op; kvlab's AscendC page copy
  and batched swap (aclrtMemcpyBatchAsync over coalesced runs) when built, else torch index
  copies, which torch_npu runs on the device.

torch_npu is imported when the backend is constructed, never at module import; so is the
AscendC library. Not yet run on Ascend hardware: tests run this code against
tests/kernels/npu_emulation.py, a torch emulation of each op's documented contract.

kv_cache_dtype int8 (vLLM-Ascend's C8; UNVERIFIED ON HARDWARE, written against the documented
interface and vLLM-Ascend's `AscendC8AttentionBackendImpl`): int8 pages written with
kvkernels/kv_quant.py's C8 quantization (a device index copy); decodes run
`npu_fused_infer_attention_score` in the BNSD layout over the int8 pages with per-channel
antiquant scales (`key_antiquant_mode=0`, scales shaped (1, N, 1, D), zero offsets); prefill
chunks gather and dequantize their context and run the TND layout over dense K/V (cumulative
KV lengths), as vLLM-Ascend's chunked-prefill path does. Page size a multiple of 32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kvlab.errors import KvlabError
from kvlab.kernels.ascendc_ops import AscendcOps, load_ascendc_ops
from kvlab.kernels.backend import AttentionCall, KernelBackend, KVRows, refuse_unless_c8
from kvlab.kernels.extents import ExtentTable, build_extents
from kvlab.kernels.kv_quant import KVQuant
from kvlab.kernels.launch import split_batch
from kvlab.kernels.metadata import AttentionMetadata
from kvlab.kernels.torch_backend import copy_pages_by_index, swap_pages_by_index

MAX_PAGE_SIZE = 512
PAGE_SIZE_MULTIPLE = 16  # for float16/bfloat16 caches
INT8_PAGE_SIZE_MULTIPLE = 32  # for int8 (C8) caches
# some torch_npu releases document FIA's page attention with more than one query token as
# needing a multiple of 128 (128..512): 128 is safe everywhere, and vllm-ascend forces it
RECOMMENDED_PAGE_SIZE = 128
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# sparse_mode=3 takes this fixed-size "compressed" causal mask: 1 above the diagonal = masked
_CAUSAL_MASK_SIZE = 2048


def check_kv_cache(page_size: int, dtype: torch.dtype) -> None:
    """Raise KvlabError unless CANN's paged attention accepts this page size and dtype (float16
    or bfloat16 pages; int8 for kv_cache_dtype int8)."""
    if dtype not in (*SUPPORTED_DTYPES, torch.int8):
        raise KvlabError(
            f"the npu backend's attention ops take float16 or bfloat16 caches, not {dtype}; "
            "run the model in float16 or bfloat16 (--dtype)"
        )
    multiple = INT8_PAGE_SIZE_MULTIPLE if dtype == torch.int8 else PAGE_SIZE_MULTIPLE
    if not 0 < page_size <= MAX_PAGE_SIZE or page_size % multiple:
        kind = "int8" if dtype == torch.int8 else "float16/bfloat16"
        raise KvlabError(
            f"page size (--block-size) {page_size} does not suit the npu backend: CANN's paged "
            f"attention needs a multiple of {multiple} that is at most {MAX_PAGE_SIZE} "
            f"for {kind} ({RECOMMENDED_PAGE_SIZE} recommended)"
        )



class NpuBackend(KernelBackend):
    """Kernels from torch_npu for Ascend NPUs (Atlas A2/A3); needs torch_npu and CANN."""

    name = "npu"
    supports_sliding_window = False
    # and bfloat16/float16 where the model runs in it; int8 unverified on hardware
    kv_cache_dtypes = ("auto", "int8")

    def __init__(self) -> None:
        self._ops = _import_torch_npu()
        self._ascendc: AscendcOps | None = load_ascendc_ops()  # None until built on the machine
        self._causal_masks: dict[torch.device, Tensor] = {}
        self._last_extents: tuple[AttentionMetadata, ExtentTable, bool] | None = None

    def _write_kv(self, rows: KVRows) -> None:
        """`npu_scatter_pa_kv_cache`; C8 rows by a device index copy.

        The op documents slots in [0, num_slots) only, so rows marked -1 are dropped first
        (one host sync to learn whether any are).
        """
        key, value, k_cache, v_cache = rows.key, rows.value, rows.k_cache, rows.v_cache
        slot_mapping, kv_quant = rows.slot_mapping, rows.kv_quant
        refuse_unless_c8(self.name, kv_quant)
        check_kv_cache(k_cache.shape[1], k_cache.dtype)
        keep = slot_mapping >= 0
        if not bool(keep.all()):
            key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
        if slot_mapping.numel() == 0:
            return
        if kv_quant is not None:  # C8: quantized rows, written by a device index copy
            slots = slot_mapping.to(torch.int64)
            for new, cache, side in ((key, k_cache, "k"), (value, v_cache, "v")):
                cache.view(-1, *cache.shape[2:]).index_copy_(0, slots,
                                                            kv_quant.quantize(new, side))
            return
        self._ops.npu_scatter_pa_kv_cache(
            key.to(k_cache.dtype).contiguous(),
            value.to(v_cache.dtype).contiguous(),
            k_cache,
            v_cache,
            slot_mapping.contiguous(),
            cache_mode="Norm",
        )

    def _paged_attention(self, call: AttentionCall) -> Tensor:
        """C8 pages: `_c8_attention`; float16/bfloat16 pages: the decode fast path or the
        fused op (full attention only)."""
        refuse_unless_c8(self.name, call.kv_quant)
        check_kv_cache(call.meta.page_size, call.k_cache.dtype)
        assert call.k_cache.shape[1] == call.meta.page_size, (
            "cache pages must hold meta.page_size slots")
        if call.kv_quant is not None:
            result = self._c8_attention(call, call.query.contiguous(), call.kv_quant)
        else:
            query = call.query.to(call.k_cache.dtype).contiguous()
            if call.meta.is_decode_only:
                result = self._decode(call, query)
            else:
                result = self._fused(call, query)
        if call.out is None:
            return result
        if result is not call.out:
            call.out.copy_(result)
        return call.out

    def _c8_attention(self, call: AttentionCall, query: Tensor, kv_quant: KVQuant) -> Tensor:
        """Attention over int8 (C8) pages, as vLLM-Ascend's chunked-prefill path: decodes in
        one BNSD call over the pages with antiquant scales, prefill chunks in one TND call
        over their gathered, dequantized contexts. Unverified on hardware."""
        meta = call.meta
        out = torch.empty_like(query)
        starts = meta.query_start_loc_cpu
        decode_ids, prefill_ids = split_batch(meta)
        if decode_ids:
            rows = torch.tensor([starts[i] for i in decode_ids], device=query.device)
            ids = torch.tensor(decode_ids, device=query.device)
            out[rows] = self._c8_decode(call, query[rows], kv_quant,
                                        meta.block_tables[ids].contiguous(),
                                        [meta.seq_lens_cpu[i] for i in decode_ids])
        if prefill_ids:
            rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in prefill_ids])
            rows = rows.to(query.device)
            out[rows] = self._c8_prefill(call, query[rows], kv_quant, prefill_ids)
        return out

    def _c8_decode(self, call: AttentionCall, query: Tensor, kv_quant: KVQuant,
                   block_tables: Tensor, seq_lens: list[int]) -> Tensor:
        """One new token per sequence (`query`'s rows) over int8 pages: FIA in BNSD with
        per-channel antiquant (vLLM-Ascend's `_forward_c8_decode`)."""
        k_cache, v_cache, num_kv_heads = call.k_cache, call.v_cache, call.num_kv_heads
        num_pages, page_size = k_cache.shape[:2]
        antiquant = {}
        for side, name in (("k", "key"), ("v", "value")):
            channel = kv_quant.channel_scale(side)
            assert channel is not None
            bnsd = channel.to(query.dtype).view(1, num_kv_heads, 1, -1).contiguous()
            antiquant[f"{name}_antiquant_scale"] = bnsd
            antiquant[f"{name}_antiquant_offset"] = torch.zeros_like(bnsd)
        output: Tensor
        output, _ = self._ops.npu_fused_infer_attention_score(
            query.unsqueeze(2),  # [B, N, 1, D]
            k_cache.view(num_pages, page_size, -1),
            v_cache.view(num_pages, page_size, -1),
            **antiquant,
            block_table=block_tables,
            actual_seq_lengths_kv=seq_lens,
            num_heads=query.shape[1],
            num_key_value_heads=num_kv_heads,
            input_layout="BNSD",
            scale=call.scale,
            block_size=page_size,
            key_antiquant_mode=0,
            value_antiquant_mode=0,
            sparse_mode=0,
        )
        return output.squeeze(2)

    def _c8_prefill(self, call: AttentionCall, query: Tensor, kv_quant: KVQuant,
                    seq_ids: list[int]) -> Tensor:
        """Prefill chunks (`query`'s rows) over int8 pages: each context gathered and
        dequantized, then FIA in TND over the dense K/V (vLLM-Ascend's
        `_dequant_paged_kv_to_dense` path)."""
        k_cache, v_cache, meta = call.k_cache, call.v_cache, call.meta
        page_size = k_cache.shape[1]
        dense_k: list[Tensor] = []
        dense_v: list[Tensor] = []
        q_ends: list[int] = []
        kv_ends: list[int] = []
        for seq_id in seq_ids:
            seq_len = meta.seq_lens_cpu[seq_id]
            table = meta.block_tables[seq_id, : -(-seq_len // page_size)].to(torch.int64)
            for cache, side, dense in ((k_cache, "k", dense_k), (v_cache, "v", dense_v)):
                rows = cache.index_select(0, table).view(-1, *cache.shape[2:])[:seq_len]
                dense.append(kv_quant.dequantize(rows, side).to(query.dtype))
            q_ends.append((q_ends[-1] if q_ends else 0) + meta.query_lens_cpu[seq_id])
            kv_ends.append((kv_ends[-1] if kv_ends else 0) + seq_len)
        output: Tensor
        output, _ = self._ops.npu_fused_infer_attention_score(
            query,
            torch.cat(dense_k),
            torch.cat(dense_v),
            atten_mask=self._causal_mask(query.device),
            actual_seq_lengths=q_ends,
            actual_seq_lengths_kv=kv_ends,  # cumulative: dense TND
            num_heads=query.shape[1],
            scale=call.scale,
            input_layout="TND",
            num_key_value_heads=call.num_kv_heads,
            sparse_mode=3,
        )
        return output

    def copy_pages(self, k_cache: Tensor, v_cache: Tensor, pairs: Tensor) -> None:
        """kvlab's AscendC page copy when built (staged where a page is both read and
        written), else torch index copies."""
        if self._ascendc is None or pairs.shape[0] == 0:
            copy_pages_by_index(k_cache, v_cache, pairs)
            return
        pairs = pairs.to(k_cache.device, torch.int64)
        src_ids, dst_ids = pairs[:, 0], pairs[:, 1]
        if not bool(torch.isin(dst_ids, src_ids).any()):
            self._ascendc.copy_pages(k_cache, v_cache, src_ids, dst_ids)
            return
        # a page both read and written would race between cores: stage the sources first
        shape = (len(pairs), *k_cache.shape[1:])
        stage = (k_cache.new_empty(shape), v_cache.new_empty(shape))
        order = torch.arange(len(pairs), device=k_cache.device)
        self._ascendc.move_pages((k_cache, v_cache), stage, src_ids, order)
        self._ascendc.move_pages(stage, (k_cache, v_cache), order, dst_ids)

    def swap_pages(
        self, src_k: Tensor, src_v: Tensor, dst_k: Tensor, dst_v: Tensor, pairs: Tensor
    ) -> None:
        """One batch of coalesced runs with kvlab's AscendC swap when built, else torch index
        copies."""
        one_side_host = _is_host(src_k) != _is_host(dst_k)
        if self._ascendc is None or not one_side_host or pairs.shape[0] == 0:
            swap_pages_by_index(src_k, src_v, dst_k, dst_v, pairs)
            return
        self._ascendc.swap_pages(src_k, src_v, dst_k, dst_v, pairs.cpu())

    def _decode(self, call: AttentionCall, query: Tensor) -> Tensor:
        """One new token per sequence: the decode-only fast path, written into `call.out`."""
        k_cache, v_cache, meta, scale = call.k_cache, call.v_cache, call.meta, call.scale
        num_kv_heads, out = call.num_kv_heads, call.out
        if out is None or not out.is_contiguous() or out.dtype != query.dtype:
            out = torch.empty_like(query)
        if self._ascendc is not None and self._ascendc.can_decode(
            query.shape[1], num_kv_heads, query.shape[2]
        ):
            extents, has_runs = self._extents(meta)
            # runs of pages (dynamic block sizes): kvlab's kernel reads each run as one DMA
            if has_runs:
                self._ascendc.paged_decode(
                    query, k_cache, v_cache, extents, meta.seq_lens, scale, out
                )
                return out
        self._ops._npu_paged_attention(
            query=query,
            key_cache=k_cache,
            value_cache=v_cache,
            num_kv_heads=num_kv_heads,
            num_heads=query.shape[1],
            scale_value=scale,
            block_table=meta.block_tables,
            # a host tensor: the op tiles the work on the CPU side (as vllm-ascend passes it)
            context_lens=torch.tensor(meta.seq_lens_cpu, dtype=torch.int32),
            out=out,
        )
        return out

    def _fused(self, call: AttentionCall, query: Tensor) -> Tensor:
        """A batch with prefill chunks: one fused call over all sequences in the TND layout."""
        k_cache, v_cache, meta = call.k_cache, call.v_cache, call.meta
        num_pages, page_size = k_cache.shape[:2]
        # TND semantics, from the torch_npu docs (Ascend/op-plugin,
        # docs/context/torch_npu-npu_fused_infer_attention_score.md): actual_seq_lengths holds
        # CUMULATIVE query ends, one per sequence (its length is the batch size), while with
        # page attention actual_seq_lengths_kv holds each sequence's own context length.
        # vllm-ascend's attention_v1.py passes exactly query_start_loc[1:] and seq_lens.
        output: Tensor
        output, _ = self._ops.npu_fused_infer_attention_score(
            query,
            k_cache.view(num_pages, page_size, -1),
            v_cache.view(num_pages, page_size, -1),
            atten_mask=self._causal_mask(query.device),
            actual_seq_lengths=meta.query_start_loc_cpu[1:],
            actual_seq_lengths_kv=list(meta.seq_lens_cpu),
            block_table=meta.block_tables,
            num_heads=query.shape[1],
            scale=call.scale,
            input_layout="TND",
            num_key_value_heads=call.num_kv_heads,
            sparse_mode=3,
            block_size=page_size,
        )
        return output

    def _extents(self, meta: AttentionMetadata) -> tuple[ExtentTable, bool]:
        """The batch's extent table and whether it has runs, once per step: every layer's call
        gets the same metadata object, and only the first pays the host sync."""
        if self._last_extents is None or self._last_extents[0] is not meta:
            extents = build_extents(meta.block_tables, meta.seq_lens, meta.page_size)
            self._last_extents = (meta, extents, extents.has_runs())
        return self._last_extents[1], self._last_extents[2]

    def _causal_mask(self, device: torch.device) -> Tensor:
        """The 2048 x 2048 int8 mask sparse_mode=3 expects, built once per device."""
        mask = self._causal_masks.get(device)
        if mask is None:
            ones = torch.ones(_CAUSAL_MASK_SIZE, _CAUSAL_MASK_SIZE, dtype=torch.int8)
            mask = torch.triu(ones, diagonal=1).to(device)
            self._causal_masks[device] = mask
        return mask


def _is_host(cache: Tensor) -> bool:
    """True for a cache in host memory (swap space), False for one on the NPU."""
    return cache.device.type == "cpu"


def _import_torch_npu() -> Any:
    """torch_npu, or a KvlabError saying what this backend needs."""
    try:
        import torch_npu
    except (ImportError, OSError, RuntimeError) as err:
        raise KvlabError(
            "the npu attention backend needs torch_npu and the CANN toolkit on an Ascend "
            f"machine (import torch_npu failed: {err}); use attention_backend torch or triton "
            "elsewhere",
            parameters=("attention_backend",),
        ) from err
    return torch_npu
