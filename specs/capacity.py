"""How many KV-cache pages fit on a device, sized the way vLLM sizes them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.specs.hardware import HardwareSpec, check_tensor_parallel
from kvlab.specs.kv_layout import KVLayout, LayoutGroup, kv_cache_groups
from kvlab.specs.model import ModelSpec

# vLLM profiles one forward pass of max_num_batched_tokens tokens to find peak activations;
# 8192 is the middle of its defaults (2048-16384), 256 sequences sample logits at the end.
PROFILE_NUM_TOKENS = 8192
PROFILE_NUM_SEQS = 256
# Memory outside the tensor allocator that grows at start-up (communication buffers, GEMM
# workspaces) [estimate].
NON_TORCH_BYTES = 512 * 1024**2


@dataclass(slots=True, frozen=True)
class KVCapacity:
    """The KV cache one device holds: pages of `page_size` tokens, `page_bytes` each (all layers).

    `weight_bytes` and `activation_bytes` are what was set aside before the pages, per device.
    `layout` is how the model's KV-cache groups share the pages (None: one full-attention group).
    """

    num_pages: int
    page_size: int
    page_bytes: int
    num_tokens: int
    weight_bytes: int
    activation_bytes: int
    layout: KVLayout | None = None

    def max_concurrency(self, max_model_len: int, *, max_in_flight_tokens: int | None = None,
                        enable_prefix_caching: bool = False) -> float:
        """Requests of max_model_len tokens that fit at once (vLLM counts whole pages each, in
        every KV-cache group: `KVLayout.max_concurrency`, whose arguments these are)."""
        if self.layout is None:
            return self.num_pages / math.ceil(max_model_len / self.page_size)
        return self.layout.max_concurrency(self.num_pages, max_model_len,
                                           max_in_flight_tokens=max_in_flight_tokens,
                                           enable_prefix_caching=enable_prefix_caching)

    def group_usage(self, num_tokens: int, *, max_in_flight_tokens: int | None = None,
                    enable_prefix_caching: bool = False) -> list[GroupUsage]:
        """Where a request of `num_tokens` tokens puts its bytes: one row per KV-cache group."""
        layout = self.layout or kv_layout_of_plain_pages(self)
        pages = layout.pages_per_request(num_tokens, max_in_flight_tokens=max_in_flight_tokens,
                                         enable_prefix_caching=enable_prefix_caching)
        return [GroupUsage(group, num_pages, num_pages * self.page_bytes,
                           num_pages * group.num_layers * group.layer_used_bytes)
                for group, num_pages in zip(layout.groups, pages, strict=True)]

    def startup_lines(self, max_model_len: int, *, device: str = "GPU",
                      max_in_flight_tokens: int | None = None,
                      enable_prefix_caching: bool = False) -> list[str]:
        """The line vLLM prints at start-up, with its number formatting (`device`: GPU, CPU
        or NPU; the other arguments are `max_concurrency`'s)."""
        concurrency = self.max_concurrency(max_model_len,
                                           max_in_flight_tokens=max_in_flight_tokens,
                                           enable_prefix_caching=enable_prefix_caching)
        return startup_lines(device, max_model_len, concurrency)


def startup_lines(device: str, max_model_len: int, concurrency: float) -> list[str]:
    """vLLM 0.32's start-up line (`update_kv_cache_capacity`), in its number formatting: the
    KV cache's size in tokens as requests of `max_model_len` tokens at once take them (so a
    sliding window's savings count; `int(concurrency x max_model_len)`) and that concurrency.
    `device`: GPU, CPU or NPU, as vLLM names the pool. The simulator and the engine print it."""
    num_tokens = int(concurrency * max_model_len)
    return [f"{device} KV cache size: {num_tokens:,} tokens, Maximum concurrency for "
            f"{max_model_len:,} tokens per request: {concurrency:.2f}x"]


def device_name(platform: str) -> str:
    """How vLLM names a platform's KV pool in its start-up line: `cuda` GPU, `cpu` CPU,
    `ascend` or `npu` NPU (`block_rules.platform_of`, the engine's platform names)."""
    return {"cpu": "CPU", "ascend": "NPU", "npu": "NPU"}.get(platform, "GPU")


@dataclass(slots=True, frozen=True)
class GroupUsage:
    """One KV-cache group's share of one request: pool pages, their bytes, and the bytes its
    layers' data fill (the rest is padding: empty layer slots, a state smaller than a page)."""

    group: LayoutGroup
    num_pages: int
    page_bytes: int
    used_bytes: int


def kv_layout_of_plain_pages(capacity: KVCapacity) -> KVLayout:
    """One full-attention group filling the pages of a capacity made without a layout."""
    group = LayoutGroup("full", 1, 0, 0, capacity.page_bytes, capacity.page_bytes)
    return KVLayout((group,), capacity.page_size, capacity.page_size, 1, capacity.page_bytes)


def estimate_activation_bytes(model: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """Peak activation memory of vLLM's profiling forward pass, per device, estimated.

    One layer's intermediates are live at a time: residual and normed hidden states, the QKV
    projection, and the MLP's gate/up output with its activation; then fp32 logits of the sampled
    sequences; plus NON_TORCH_BYTES.
    """
    tp = tensor_parallel_size
    qkv_width = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim / tp
    per_token = 2 * model.hidden_size + qkv_width + 3 * model.intermediate_size / tp
    layer_bytes = PROFILE_NUM_TOKENS * per_token * model.dtype_bytes
    logits_bytes = PROFILE_NUM_SEQS * model.vocab_size * 4
    return math.ceil(layer_bytes + logits_bytes) + NON_TORCH_BYTES


def kv_cache_capacity_tokens(
    model: ModelSpec,
    hardware: HardwareSpec,
    *,
    page_size: int,
    gpu_memory_utilization: float = 0.9,
    tensor_parallel_size: int = 1,
    num_gpu_blocks_override: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    activation_reserve_bytes: int | None = None,
    hybrid_kv_cache_manager: bool = True,
) -> KVCapacity:
    """The KV cache that fits on each device: HBM x utilisation - weights - activations.

    `activation_reserve_bytes` defaults to `estimate_activation_bytes`. `num_gpu_blocks_override`
    sets the page count outright, as vLLM's flag does, whatever the memory says; else
    `kv_cache_memory_bytes` sets the KV cache's bytes per device (vLLM's
    `--kv-cache-memory-bytes`: utilisation, weights and activations then play no part). Raises
    KvlabError for bad flags and when not even one page fits.

    Pages are pool pages of the model's KV layout (`kvlab.specs.kv_layout.kv_cache_groups`,
    which `hybrid_kv_cache_manager` goes to): for a model whose layers are all full attention,
    `page_size x kv_bytes_per_token` in its `kv_cache_dtype` (`ModelSpec.with_kv_cache_dtype`);
    for models with linear-attention layers `page_size` may come back raised, as vLLM raises it.
    """
    _check_flags(page_size, gpu_memory_utilization, num_gpu_blocks_override)
    check_tensor_parallel(model, hardware, tensor_parallel_size)
    layout = kv_cache_groups(model, page_size, tensor_parallel_size,
                             hybrid_kv_cache_manager=hybrid_kv_cache_manager)
    page_size, page_bytes = layout.block_size, layout.page_bytes
    weight_bytes = model.weight_bytes(tensor_parallel_size)
    activation_bytes = (
        estimate_activation_bytes(model, tensor_parallel_size)
        if activation_reserve_bytes is None
        else activation_reserve_bytes
    )
    requested = math.ceil(hardware.hbm_bytes * gpu_memory_utilization)
    available = requested - weight_bytes - activation_bytes
    num_pages = max(available, 0) // page_bytes
    if num_gpu_blocks_override is not None:
        num_pages = num_gpu_blocks_override
    elif kv_cache_memory_bytes is not None:
        why = f"kv_cache_memory_bytes is {kv_cache_memory_bytes:,}"
        num_pages = num_pages_for_budget(kv_cache_memory_bytes, page_bytes, why,
                                         ("kv_cache_memory_bytes",))
    elif num_pages < 1:
        raise KvlabError(
            f"model {model.name!r} does not fit on hardware {hardware.name!r} with room for one "
            f"KV page: {requested / 1e9:.1f} GB usable per device (gpu_memory_utilization "
            f"{gpu_memory_utilization}) minus {weight_bytes / 1e9:.1f} GB weights and "
            f"{activation_bytes / 1e9:.1f} GB activations leaves {available / 1e9:.1f} GB, "
            f"one page needs {page_bytes / 1024:.0f} KiB; raise gpu_memory_utilization or "
            "tensor_parallel_size, lower block_size, or set num_gpu_blocks_override",
            parameters=(
                "gpu_memory_utilization", "tensor_parallel_size", "block_size",
                "num_gpu_blocks_override",
            ),
        )
    return KVCapacity(
        num_pages=num_pages,
        page_size=page_size,
        page_bytes=page_bytes,
        num_tokens=num_pages * page_size,
        weight_bytes=weight_bytes,
        activation_bytes=activation_bytes,
        layout=layout,
    )


def num_pages_for_budget(
    budget_bytes: int, page_bytes: int, why: str, parameters: tuple[str, ...]
) -> int:
    """Pages that fit in a budget; below one page a KvlabError with `why` (the settings and
    figures that made the budget, about `parameters`)."""
    num_pages = budget_bytes // page_bytes if budget_bytes > 0 else 0
    if num_pages < 1:
        raise KvlabError(
            f"not enough memory for one KV page of {page_bytes:,} bytes: {why}",
            parameters=parameters,
        )
    return num_pages


def _check_flags(
    page_size: int, gpu_memory_utilization: float, num_gpu_blocks_override: int | None
) -> None:
    if page_size < 1:
        raise KvlabError(
            f"block_size is {page_size}, expected a whole number >= 1",
            parameters=("block_size",),
        )
    if not 0 < gpu_memory_utilization <= 1:
        raise KvlabError(
            f"gpu_memory_utilization is {gpu_memory_utilization}, expected a fraction in (0, 1]",
            parameters=("gpu_memory_utilization",),
        )
    if num_gpu_blocks_override is not None and num_gpu_blocks_override < 1:
        raise KvlabError(
            f"num_gpu_blocks_override is {num_gpu_blocks_override}, expected a whole number >= 1",
            parameters=("num_gpu_blocks_override",),
        )
