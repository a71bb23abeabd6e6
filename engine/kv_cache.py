"""The KV cache tensors, allocated: per-layer K and V pages on the device, the host swap space
and the host tier, in the page format of the cache's dtype, and each layer's view as the
model's forward takes it. Their size is chosen in `kvlab.engine.kv_sizing`; MemOps are carried
out on them by `kvlab.engine.kv_mem_ops`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kvlab.engine.kv_mem_ops import execute_mem_ops
from kvlab.engine.models.config import ModelConfig
from kvlab.engine.platform import Platform
from kvlab.errors import KvlabError
from kvlab.kernels.kv_quant import KVQuant, check_head_dim, page_format
from kvlab.policies.outputs import MemOps
from kvlab.policies.serving import GiB
from kvlab.specs.kv_dtype import KVCacheDType
from kvlab.specs.kv_dtype import kv_cache_dtype as kv_dtype

# A layer's pages as the model's forward takes them: (k_cache, v_cache), and the layer's
# KVQuant where they are quantized
LayerCache = tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, KVQuant]


def layer_kv_quants(dtype: KVCacheDType, head_dim: int, num_kv_heads: int, num_layers: int,
                    kv_quants: Sequence[KVQuant] | None, device: torch.device,
                    ) -> list[KVQuant] | None:
    """Each model layer's KVQuant: the given ones (checked), else the defaults (fp8 and C8
    scales 1.0); None for float pages."""
    if not dtype.is_quantized:
        assert not kv_quants, f"kv_cache_dtype {dtype.name} stores float pages: no KVQuant"
        return None
    if kv_quants is not None:
        assert len(kv_quants) == num_layers, f"{len(kv_quants)} KVQuants for {num_layers} layers"
        assert all(q.dtype == dtype and q.head_dim == head_dim for q in kv_quants)
        return list(kv_quants)
    check_head_dim(dtype, head_dim)
    ones = torch.ones(num_kv_heads, head_dim, device=device) \
        if dtype.scales == "per_channel" else None
    return [KVQuant(dtype, head_dim, k_channel_scale=ones, v_channel_scale=ones)
            for _ in range(num_layers)]


def _check_fits(platform: Platform, num_pages: int, num_host_pages: int,
                page_bytes: int) -> None:
    """A KvlabError, before allocating, when the pages cannot fit in the device's free memory:
    the device pages, and on cpu the host pages too (swap and host tier: the same RAM). On an
    accelerator the host pages' RAM is not checked here."""
    device_bytes = num_pages * page_bytes
    host_bytes = num_host_pages * page_bytes
    on_cpu = platform.device.type == "cpu"
    free = platform.free_memory_bytes()
    if device_bytes + (host_bytes if on_cpu else 0) > free:
        raise KvlabError(
            f"{num_pages:,} KV pages need {device_bytes / GiB:.1f} GiB"
            + (f" (and {num_host_pages:,} swap and host-tier pages {host_bytes / GiB:.1f} GiB)"
               if on_cpu and host_bytes else "")
            + f", more than the {free / GiB:.1f} GiB free on {platform.device}; lower "
            "num_gpu_blocks_override, kv_cache_memory_bytes, swap_space_bytes or kv_tiers",
            parameters=("num_gpu_blocks_override", "kv_cache_memory_bytes", "swap_space_bytes",
                        "kv_tiers"))


def page_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """A zeroed tensor of pages. Zeros, not empty: a kernel that loads a whole page and masks
    scores must not meet NaN. On the CPU the zeros come from calloc (numpy's `zeros`): the OS
    maps zero pages as they are first written, so a cache, or a precision level, larger than
    what a run writes holds only what it wrote (a 512 MiB CPU cache and its demoted levels
    were written out in full before: seconds of system time and GBs of resident memory)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = math.prod(shape) * dtype.itemsize
    return torch.from_numpy(np.zeros(num_bytes, dtype=np.uint8)).view(dtype).view(shape)


class KVCache:
    """Per-layer K and V pages on the device (layers of different KV-cache groups may share a
    tensor: `layer_slots`), the host swap space and the host tier (prefix
    pages below the device, policies/tiers/), same layout.

    Each tensor is [num_pages, page_size, num_kv_heads, head_dim] of the model's `dtype`; with
    a `kv_cache_dtype` other than auto, of what kvkernels/kv_quant.py's `page_format` says (fp8
    as uint8 bits, C8 as int8, per-token-head rows of values and their fp32 scale as uint8),
    and `kv_quants[i]` is model layer i's KVQuant (its static scales; default: fp8 scales
    1.0, C8 scales 1.0 until the engine calibrates them). Scales that live in pages move with
    them. The host tensors are pinned where the platform has DMA. `backend` is the
    kvlab.kernels backend that moves pages.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        num_host_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        platform: Platform,
        backend: Any,
        num_tier_pages: int = 0,
        layer_slots: tuple[int, ...] = (),
        kv_cache_dtype: str = "auto",
        kv_quants: Sequence[KVQuant] | None = None,
    ) -> None:
        self.layer_slots = layer_slots  # model layer -> its tensors (empty: layer i, tensor i)
        # mixed-precision pages (engine/precision_pages.py `attach`), where pages are demoted
        self.precision: Any = None
        self.num_pages = num_pages
        self.num_host_pages = num_host_pages
        self.num_tier_pages = num_tier_pages
        self.page_size = page_size
        self.backend = backend
        self.kv_cache_dtype = kv_dtype(kv_cache_dtype)
        num_model_layers = len(layer_slots) if layer_slots else num_layers
        self.kv_quants = layer_kv_quants(self.kv_cache_dtype, head_dim, num_kv_heads,
                                          num_model_layers, kv_quants, platform.device)
        dtype, row = page_format(self.kv_cache_dtype, head_dim, dtype)
        shape = (num_pages, page_size, num_kv_heads, row)
        host_shape = (num_host_pages, page_size, num_kv_heads, row)
        page_bytes = 2 * num_layers * page_size * num_kv_heads * row * dtype.itemsize
        _check_fits(platform, num_pages, num_host_pages + num_tier_pages, page_bytes)
        device = platform.device
        self.k_caches = [page_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v_caches = [page_zeros(shape, dtype, device) for _ in range(num_layers)]
        pin = platform.pin_memory and num_host_pages > 0
        self.host_k_caches = [
            torch.zeros(host_shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)
        ]
        self.host_v_caches = [
            torch.zeros(host_shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)
        ]
        tier_shape = (num_tier_pages, page_size, num_kv_heads, row)
        pin_tier = platform.pin_memory and num_tier_pages > 0
        self.tier_k_caches = [torch.zeros(tier_shape, dtype=dtype, pin_memory=pin_tier)
                              for _ in range(num_layers if num_tier_pages else 0)]
        self.tier_v_caches = [torch.zeros(tier_shape, dtype=dtype, pin_memory=pin_tier)
                              for _ in range(num_layers if num_tier_pages else 0)]

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        *,
        num_pages: int,
        num_host_pages: int,
        page_size: int,
        dtype: torch.dtype,
        platform: Platform,
        backend: Any,
        num_tier_pages: int = 0,
        layer_slots: tuple[int, ...] = (),
        kv_cache_dtype: str = "auto",
        kv_quants: Sequence[KVQuant] | None = None,
    ) -> KVCache:
        """The cache for one model's layers and KV heads (`layer_slots`: each layer's tensor
        where KV-cache groups share them, `CacheLayout`), its pages in `kv_cache_dtype` with
        each layer's `kv_quants`."""
        return cls(
            num_layers=max(layer_slots) + 1 if layer_slots else config.num_hidden_layers,
            layer_slots=layer_slots,
            num_pages=num_pages,
            num_host_pages=num_host_pages,
            page_size=page_size,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=dtype,
            platform=platform,
            backend=backend,
            num_tier_pages=num_tier_pages,
            kv_cache_dtype=kv_cache_dtype,
            kv_quants=kv_quants,
        )

    def layers(self) -> list[LayerCache]:
        """(k_cache, v_cache) per model layer, as the model's forward takes them; with
        quantized pages (k_cache, v_cache, kv_quant)."""
        if self.precision is not None:  # (k_cache, v_cache, MixedLayer)
            return self.precision.layers()  # type: ignore[no-any-return]
        slots = self.layer_slots or range(len(self.k_caches))
        if self.kv_quants is None:
            return [(self.k_caches[slot], self.v_caches[slot]) for slot in slots]
        return [(self.k_caches[slot], self.v_caches[slot], quant)
                for slot, quant in zip(slots, self.kv_quants, strict=True)]

    def execute_mem_ops(self, mem_ops: MemOps) -> None:
        """Carry out a step's memory work in MemOps' order (`kv_mem_ops.execute_mem_ops`)."""
        execute_mem_ops(self, mem_ops)

    @property
    def num_bytes(self) -> int:
        """Device bytes of all K and V pages."""
        return sum(t.numel() * t.element_size() for t in self.k_caches + self.v_caches)
