"""Host-side plumbing the Triton attention launchers share (the triton backend, the
mixed-precision kernel and the ascend backend): the batch split into decodes and prefill
chunks, the argument checks, the sequence ids a launch covers, and what the kernels take of a
layer's caches. Torch only: nothing here imports Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kvlab.kernels.kv_quant import (
    MODE_INT4,
    MODE_PER_CHANNEL,
    MODE_PER_TOKEN_HEAD,
    MODE_PLAIN,
    KVQuant,
)
from kvlab.kernels.metadata import AttentionMetadata


def split_batch(meta: AttentionMetadata) -> tuple[list[int], list[int]]:
    """The batch's sequences with one new token (decodes) and with more (prefill chunks)."""
    decode_ids = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
    prefill_ids = [i for i, n in enumerate(meta.query_lens_cpu) if n > 1]
    return decode_ids, prefill_ids


def check_cache_pair(k_cache: Tensor, v_cache: Tensor) -> None:
    """Assert a K/V cache pair is contiguous and of one shape."""
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert k_cache.shape == v_cache.shape, "K and V caches must have the same shape"


def seq_ids_tensor(seq_ids: list[int], num_seqs: int, device: torch.device) -> Tensor:
    """Device int32 ids of the sequences one launch covers (an arange when it covers all)."""
    if len(seq_ids) == num_seqs:
        return torch.arange(num_seqs, dtype=torch.int32, device=device)
    return torch.tensor(seq_ids, dtype=torch.int32, device=device)


def dot_precision(dtype: torch.dtype) -> str:
    """Exact fp32 products for fp32 inputs (TF32 would cost about 1e-3 relative error)."""
    return "ieee" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True, slots=True)
class KVArgs:
    """What the attention kernels take of a layer's K and V caches (kvkernels/triton_tiles.py's
    `load_kv`): the pages as their stored values' dtype, the scale tensors, the per-tensor
    scales, a row's width and the mode."""

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


def kv_args(k_cache: Tensor, v_cache: Tensor, kv_quant: KVQuant | None) -> KVArgs:
    """The kernels' view of a layer's caches stored by `kv_quant` (None: float pages; the
    scale arguments are then unused, the caches stand in for them)."""
    row = k_cache.shape[3]
    if kv_quant is None:
        return KVArgs(k_cache, v_cache, k_cache, v_cache, 1.0, 1.0, row, MODE_PLAIN)
    mode = kv_quant.mode
    k_scales, v_scales = k_cache, v_cache
    if mode == MODE_PER_CHANNEL:
        k_channel, v_channel = kv_quant.channel_scale("k"), kv_quant.channel_scale("v")
        assert k_channel is not None and v_channel is not None
        k_scales, v_scales = k_channel, v_channel
    elif mode in (MODE_PER_TOKEN_HEAD, MODE_INT4):
        k_scales, v_scales = kv_quant.scale_view(k_cache), kv_quant.scale_view(v_cache)
    return KVArgs(kv_quant.data_view(k_cache), kv_quant.data_view(v_cache), k_scales,
                  v_scales, kv_quant.k_scale, kv_quant.v_scale, row, mode)
