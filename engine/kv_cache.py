"""The KV cache tensors: sizing them like vLLM, allocating them, and carrying out MemOps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kvlab.engine.models.config import ModelConfig
from kvlab.engine.platform import Platform
from kvlab.errors import KvlabError
from kvlab.kernels.kv_quant import KVQuant, check_head_dim, page_format
from kvlab.policies.outputs import MemOps, TierBatch
from kvlab.policies.serving import GiB, ServingConfig
from kvlab.specs.capacity import device_name, num_pages_for_budget
from kvlab.specs.capacity import startup_lines as capacity_startup_lines
from kvlab.specs.kv_dtype import KVCacheDType
from kvlab.specs.kv_dtype import kv_cache_dtype as kv_dtype
from kvlab.specs.kv_groups import FULL_ATTENTION, KVCacheGroup
from kvlab.specs.kv_layout import max_in_flight_tokens

# A layer's pages as the model's forward takes them: (k_cache, v_cache), and the layer's
# KVQuant where they are quantized
LayerCache = tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, KVQuant]

# vLLM's CPU backend reserves 4 GiB for KV when VLLM_CPU_KVCACHE_SPACE is unset.
DEFAULT_CPU_KV_CACHE_BYTES = 4 * GiB


def page_bytes_all_layers(config: ModelConfig, page_size: int, dtype: torch.dtype,
                          num_cache_layers: int | None = None,
                          kv_cache_dtype: str = "auto") -> int:
    """Bytes one page takes over every layer, K and V (over `num_cache_layers` layer tensors
    where KV-cache groups share them: `CacheLayout`), for a model in `dtype` whose pages store
    `kv_cache_dtype` (vLLM's names; per-token-head scales included)."""
    row_bytes = kv_dtype(kv_cache_dtype).head_token_bytes(config.head_dim, dtype.itemsize)
    num_layers = config.num_hidden_layers if num_cache_layers is None else num_cache_layers
    return page_size * 2 * num_layers * config.num_key_value_heads * row_bytes


def sizing_warnings(platform: Platform, serving: ServingConfig) -> list[str]:
    """Settings that size no KV cache on `platform`, said once at start-up rather than
    ignored in silence: gpu_memory_utilization on cpu, where kv_cache_memory_bytes or
    num_gpu_blocks_override sizes the cache, else DEFAULT_CPU_KV_CACHE_BYTES."""
    utilization = serving.gpu_memory_utilization
    if platform.name == "cpu" and utilization != ServingConfig().gpu_memory_utilization:
        return [f"warning: gpu_memory_utilization {utilization:g} sizes no KV cache on cpu "
                "(kv_cache_memory_bytes or num_gpu_blocks_override does, else "
                f"{DEFAULT_CPU_KV_CACHE_BYTES // GiB} GiB)"]
    return []


def num_swap_pages(config: ModelConfig, serving: ServingConfig, dtype: torch.dtype,
                   num_cache_layers: int | None = None) -> int:
    """Host pages that fit in the serving config's `swap_space_bytes` (pages in its
    `kv_cache_dtype`, over `num_cache_layers` layer tensors: `page_bytes_all_layers`)."""
    return serving.swap_space_bytes // page_bytes_all_layers(
        config, serving.page_size, dtype, num_cache_layers, serving.kv_cache_dtype)


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's parameters."""
    return next(model.parameters()).dtype


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def determine_num_pages(
    model: Any, platform: Platform, serving: ServingConfig, max_model_len: int,
    num_cache_layers: int | None = None,
) -> int:
    """The number of device KV pages, sized like vLLM: `num_gpu_blocks_override` pages, else
    `kv_cache_memory_bytes`, else on cuda/npu `gpu_memory_utilization` of the device minus
    weights and the profiled activation peak (at the step limits), on cpu
    DEFAULT_CPU_KV_CACHE_BYTES; pages store the serving config's `kv_cache_dtype` (scales
    included), over `num_cache_layers` layer tensors (default: one per layer)."""
    if serving.num_gpu_blocks_override is not None:
        return serving.num_gpu_blocks_override
    page_size = serving.page_size
    page_bytes = page_bytes_all_layers(model.config, page_size, model_dtype(model),
                                       num_cache_layers, serving.kv_cache_dtype)
    if serving.kv_cache_memory_bytes is not None:
        budget = serving.kv_cache_memory_bytes
        why = f"kv_cache_memory_bytes is {budget:,}"
        return num_pages_for_budget(budget, page_bytes, why, ("kv_cache_memory_bytes",))
    if platform.name == "cpu":
        budget = DEFAULT_CPU_KV_CACHE_BYTES
        return num_pages_for_budget(budget, page_bytes, "the cpu default budget", ())
    peak = profile_peak_activation_bytes(
        model,
        platform,
        page_size=page_size,
        max_num_batched_tokens=serving.max_num_batched_tokens,
        max_num_seqs=serving.max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_dtype=serving.kv_cache_dtype,
    )
    total = platform.total_memory_bytes()
    weights = weights_bytes(model)
    utilization = serving.gpu_memory_utilization
    budget = int(total * utilization) - weights - peak
    why = (
        f"gpu_memory_utilization {utilization} of {total:,} bytes minus weights {weights:,} "
        f"and activation peak {peak:,} (profiled at max_num_batched_tokens "
        f"{serving.max_num_batched_tokens}) leaves {budget:,}"
    )
    parameters = ("gpu_memory_utilization", "max_num_batched_tokens")
    num_pages = num_pages_for_budget(budget, page_bytes, why, parameters)
    free = platform.free_memory_bytes()
    if num_pages * page_bytes > free:
        raise KvlabError(
            f"the KV cache would take {num_pages * page_bytes:,} bytes but only {free:,} are free "
            f"on {platform.device} (other processes?): lower gpu_memory_utilization",
            parameters=("gpu_memory_utilization",),
        )
    return num_pages


def dummy_batch_lens(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int
) -> list[int]:
    """Sequence lengths of the profiling batch: one full step of prefill, in few sequences."""
    lens: list[int] = []
    remaining = max_num_batched_tokens
    while remaining > 0 and len(lens) < max_num_seqs:
        lens.append(min(remaining, max_model_len))
        remaining -= lens[-1]
    return lens


def profile_peak_activation_bytes(
    model: Any,
    platform: Platform,
    *,
    page_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    kv_cache_dtype: str = "auto",
) -> int:
    """Peak bytes a full step (forward of max_num_batched_tokens, logits of max_num_seqs rows)
    allocates beyond the weights and its own KV pages (needs the platform's allocator stats;
    pages in `kv_cache_dtype`, whose attention dequantizes)."""
    from kvlab.kernels import AttentionMetadata

    lens = dummy_batch_lens(max_num_batched_tokens, max_num_seqs, max_model_len)
    block_tables, next_page = [], 0
    for n in lens:
        block_tables.append(list(range(next_page, next_page + math.ceil(n / page_size))))
        next_page += len(block_tables[-1])
    cache = KVCache.for_model(
        model.config,
        num_pages=next_page,
        num_host_pages=0,
        page_size=page_size,
        dtype=model_dtype(model),
        platform=platform,
        backend=model.attn_backend,
        kv_cache_dtype=kv_cache_dtype,
    )
    device = platform.device
    meta = AttentionMetadata.build(
        block_tables=block_tables,
        seq_lens=lens,
        query_lens=lens,
        page_size=page_size,
        device=device,
    )
    input_ids = torch.zeros(sum(lens), dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    num_rows = min(max_num_seqs, max_num_batched_tokens)
    platform.synchronize()
    platform.reset_peak_memory_stats()
    before = platform.memory_allocated_bytes()
    with torch.inference_mode():
        hidden = model(input_ids, positions, cache.layers(), meta)
        rows = hidden[torch.arange(num_rows, device=device) % hidden.shape[0]]
        model.compute_logits(rows).float().softmax(dim=-1)  # the sampler's working set
    platform.synchronize()
    peak = platform.peak_memory_allocated_bytes() - before
    del cache, meta, hidden, rows
    platform.empty_cache()
    return peak


def startup_lines(num_pages: int, page_size: int, max_model_len: int, *,
                  platform: str = "cuda", groups: Sequence[KVCacheGroup] | None = None,
                  max_num_batched_tokens: int | None = None,
                  enable_prefix_caching: bool = False) -> list[str]:
    """vLLM's start-up line for a cache of `num_pages` pages on `platform` (the engine's
    platform name): how many requests of `max_model_len` tokens fit at once, whole pages each
    in every KV-cache group of `groups` (None: one full-attention group) with a step's
    `max_num_batched_tokens` in flight (`KVCacheGroup.pages_per_request`)."""
    in_flight = None if max_num_batched_tokens is None else max_in_flight_tokens(
        max_num_batched_tokens, "cpu" if platform == "cpu" else "cuda")
    needed = sum(group.pages_per_request(max_model_len, page_size,
                                         max_in_flight_tokens=in_flight,
                                         enable_prefix_caching=enable_prefix_caching)
                 for group in groups or (FULL_ATTENTION,))
    return capacity_startup_lines(device_name(platform), max_model_len, num_pages / needed)


def copy_batches(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Split ordered (src, dst) copies into batches a gather-then-scatter kernel runs correctly.

    Within a batch no copy reads or rewrites a page an earlier copy of that batch wrote, so each
    batch at once equals its copies one by one in list order (copies may chain: a->b, b->c).
    """
    batches: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    written: set[int] = set()
    for src, dst in pairs:
        if src in written or dst in written:
            batches.append(current)
            current, written = [], set()
        current.append((src, dst))
        written.add(dst)
    if current:
        batches.append(current)
    return batches


def num_tier_pages(config: ModelConfig, serving: ServingConfig, dtype: torch.dtype,
                   num_cache_layers: int | None = None) -> int:
    """Pages of the host tier of the serving config, in device pages (0 without one; a whole
    number of tier pages, `TiersConfig.block_size` each; pages over `num_cache_layers` layer
    tensors); a KvlabError for a tier the engine does not run (ssd, remote: the simulator's
    only)."""
    tiers = serving.kv_tiers.tiers
    if not tiers:
        return 0
    others = [tier.kind for tier in tiers if tier.kind != "host"]
    if others:
        raise KvlabError(
            f"kv_tiers: the engine runs a host tier only, not {', '.join(others)} (simulate "
            "those with `kvlab sim --kv-tiers`)", parameters=("kv_tiers",))
    block_pages = serving.kv_tiers.block_pages(serving.page_size)
    page_bytes = page_bytes_all_layers(config, serving.page_size, dtype, num_cache_layers,
                                       serving.kv_cache_dtype)
    return tiers[0].num_blocks(page_bytes, block_pages) * block_pages


def _layer_kv_quants(dtype: KVCacheDType, head_dim: int, num_kv_heads: int, num_layers: int,
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


class KVCache:
    """Per-layer K and V pages on the device (layers of different KV-cache groups may share a
    tensor: `layer_slots`), the host swap space and the host tier (prefix
    pages below the device, policies/tiers.py), same layout.

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
        self.kv_quants = _layer_kv_quants(self.kv_cache_dtype, head_dim, num_kv_heads,
                                          num_model_layers, kv_quants, platform.device)
        dtype, row = page_format(self.kv_cache_dtype, head_dim, dtype)
        shape = (num_pages, page_size, num_kv_heads, row)
        host_shape = (num_host_pages, page_size, num_kv_heads, row)
        page_bytes = 2 * num_layers * page_size * num_kv_heads * row * dtype.itemsize
        _check_fits(platform, num_pages, num_host_pages + num_tier_pages, page_bytes)
        # Zeros, not empty: a kernel that loads a whole page and masks scores must not meet NaN.
        device = platform.device
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
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
        """Carry out a step's memory work in MemOps' order: host-tier writes, swap-outs,
        copies, swap-ins, then host-tier loads.

        Tier writes read device pages this step may overwrite, so they go first; a device page
        freed by a swap-out may be the destination of a copy, a swap-in or a tier load in the
        same step, so swap-outs go before those; copies run as if one by one in list order.
        With mixed-precision pages, requantizations run first and the page levels are
        brought up to date last (engine/precision_pages.py).
        """
        precision = self.precision
        if precision is not None:
            precision.before_mem_ops(mem_ops)
        for write in mem_ops.tier_writes:  # batch after batch: a later one may reuse a page
            self._move(write, self.k_caches, self.v_caches, self.tier_k_caches,
                       self.tier_v_caches)
        if mem_ops.swap_outs:
            pairs = torch.tensor(mem_ops.swap_outs, dtype=torch.long)
            for layer in range(len(self.k_caches)):
                self.backend.swap_pages(
                    self.k_caches[layer],
                    self.v_caches[layer],
                    self.host_k_caches[layer],
                    self.host_v_caches[layer],
                    pairs,
                )
        for batch in copy_batches(mem_ops.copies):
            pairs = torch.tensor(batch, dtype=torch.long, device=self.k_caches[0].device)
            for k_cache, v_cache in zip(self.k_caches, self.v_caches, strict=True):
                self.backend.copy_pages(k_cache, v_cache, pairs)
        if mem_ops.swap_ins:
            pairs = torch.tensor(mem_ops.swap_ins, dtype=torch.long)
            for layer in range(len(self.k_caches)):
                self.backend.swap_pages(
                    self.host_k_caches[layer],
                    self.host_v_caches[layer],
                    self.k_caches[layer],
                    self.v_caches[layer],
                    pairs,
                )
        for load in mem_ops.tier_loads:
            self._move(load, self.tier_k_caches, self.tier_v_caches, self.k_caches,
                       self.v_caches)
        if precision is not None:
            precision.after_mem_ops()

    def _move(self, batch: TierBatch, src_k: list[torch.Tensor], src_v: list[torch.Tensor],
              dst_k: list[torch.Tensor], dst_v: list[torch.Tensor]) -> None:
        """Copy a batch of pages from one memory to another, every layer (one gather, one
        transfer, one scatter: its destinations are distinct)."""
        table = torch.tensor([list(batch.src_pages), list(batch.dst_pages)], dtype=torch.long).T
        for layer in range(len(src_k)):
            self.backend.swap_pages(src_k[layer], src_v[layer], dst_k[layer], dst_v[layer],
                                    table)

    @property
    def num_bytes(self) -> int:
        """Device bytes of all K and V pages."""
        return sum(t.numel() * t.element_size() for t in self.k_caches + self.v_caches)
