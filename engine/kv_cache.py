"""The KV cache tensors: sizing them like vLLM, allocating them, and carrying out MemOps."""

from __future__ import annotations

import math
from typing import Any

import torch

from kvlab.engine.models.config import ModelConfig
from kvlab.engine.platform import Platform
from kvlab.errors import KvlabError
from kvlab.policies.outputs import MemOps, TierBatch
from kvlab.policies.serving import GiB, ServingConfig
from kvlab.specs.capacity import num_pages_for_budget

# vLLM's CPU backend reserves 4 GiB for KV when VLLM_CPU_KVCACHE_SPACE is unset.
DEFAULT_CPU_KV_CACHE_BYTES = 4 * GiB


def page_bytes_all_layers(config: ModelConfig, page_size: int, dtype: torch.dtype,
                          num_cache_layers: int | None = None) -> int:
    """Bytes one page takes over every layer, K and V (over `num_cache_layers` layer tensors
    where KV-cache groups share them: `CacheLayout`)."""
    per_token = config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
    if num_cache_layers is not None:
        per_token = per_token // config.num_hidden_layers * num_cache_layers
    return page_size * per_token


def num_swap_pages(config: ModelConfig, serving: ServingConfig, dtype: torch.dtype) -> int:
    """Host pages that fit in the serving config's `swap_space_bytes`."""
    return serving.swap_space_bytes // page_bytes_all_layers(config, serving.page_size, dtype)


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
    DEFAULT_CPU_KV_CACHE_BYTES; the KV cache takes the model's dtype, over `num_cache_layers`
    layer tensors (default: one per layer)."""
    if serving.num_gpu_blocks_override is not None:
        return serving.num_gpu_blocks_override
    page_size = serving.page_size
    page_bytes = page_bytes_all_layers(model.config, page_size, model_dtype(model),
                                       num_cache_layers)
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
) -> int:
    """Peak bytes a full step (forward of max_num_batched_tokens, logits of max_num_seqs rows)
    allocates beyond the weights and its own KV pages (needs the platform's allocator stats)."""
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


def startup_lines(num_pages: int, page_size: int, max_model_len: int) -> list[str]:
    """vLLM's two startup lines: KV cache size in tokens, and how many full-length requests fit."""
    num_tokens = num_pages * page_size
    concurrency = num_pages / math.ceil(max_model_len / page_size)
    return [
        f"GPU KV cache size: {num_tokens:,} tokens",
        f"Maximum concurrency for {max_model_len:,} tokens per request: {concurrency:.2f}x",
    ]


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


def num_tier_pages(config: ModelConfig, serving: ServingConfig, dtype: torch.dtype) -> int:
    """Pages of the host tier of the serving config, in device pages (0 without one; a whole
    number of tier pages, `TiersConfig.block_size` each); a KvlabError for a tier
    the engine does not run (ssd, remote: the simulator's only)."""
    tiers = serving.kv_tiers.tiers
    if not tiers:
        return 0
    others = [tier.kind for tier in tiers if tier.kind != "host"]
    if others:
        raise KvlabError(
            f"kv_tiers: the engine runs a host tier only, not {', '.join(others)} (simulate "
            "those with `kvlab sim --kv-tiers`)", parameters=("kv_tiers",))
    block_pages = serving.kv_tiers.block_pages(serving.page_size)
    page_bytes = page_bytes_all_layers(config, serving.page_size, dtype)
    return tiers[0].num_blocks(page_bytes, block_pages) * block_pages


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

    Each tensor is [num_pages, page_size, num_kv_heads, head_dim]; the host tensors are pinned
    where the platform has DMA. `backend` is the kvlab.kernels backend that moves pages.
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
    ) -> None:
        self.layer_slots = layer_slots  # model layer -> its tensors (empty: layer i, tensor i)
        self.num_pages = num_pages
        self.num_host_pages = num_host_pages
        self.num_tier_pages = num_tier_pages
        self.page_size = page_size
        self.backend = backend
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        host_shape = (num_host_pages, page_size, num_kv_heads, head_dim)
        page_bytes = 2 * num_layers * page_size * num_kv_heads * head_dim * dtype.itemsize
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
        tier_shape = (num_tier_pages, page_size, num_kv_heads, head_dim)
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
    ) -> KVCache:
        """The cache for one model's layers and KV heads (`layer_slots`: each layer's tensor
        where KV-cache groups share them, `CacheLayout`)."""
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
        )

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(k_cache, v_cache) per model layer, as the model's forward takes them."""
        if self.layer_slots:
            return [(self.k_caches[slot], self.v_caches[slot]) for slot in self.layer_slots]
        return list(zip(self.k_caches, self.v_caches, strict=True))

    def execute_mem_ops(self, mem_ops: MemOps) -> None:
        """Carry out a step's memory work in MemOps' order: host-tier writes, swap-outs,
        copies, swap-ins, then host-tier loads.

        Tier writes read device pages this step may overwrite, so they go first; a device page
        freed by a swap-out may be the destination of a copy, a swap-in or a tier load in the
        same step, so swap-outs go before those; copies run as if one by one in list order.
        """
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

    @property
    def num_host_bytes(self) -> int:
        """Host bytes of the swap space."""
        return sum(t.numel() * t.element_size() for t in self.host_k_caches + self.host_v_caches)
