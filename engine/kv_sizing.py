"""The KV cache's size, chosen like vLLM: bytes per page, device pages (`determine_num_pages`:
an override, a byte budget, or the device's memory less the weights and the profiled
activation peak), host swap and host-tier pages, and vLLM's start-up line of how many
requests fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kvlab.engine.kv_cache import KVCache
from kvlab.engine.models.config import ModelConfig
from kvlab.engine.platform import Platform
from kvlab.errors import KvlabError
from kvlab.policies.serving import GiB, ServingConfig
from kvlab.specs.capacity import device_name, num_pages_for_budget
from kvlab.specs.capacity import startup_lines as capacity_startup_lines
from kvlab.specs.kv_dtype import kv_cache_dtype as kv_dtype
from kvlab.specs.kv_groups import FULL_ATTENTION, KVCacheGroup
from kvlab.specs.kv_layout import max_in_flight_tokens

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
