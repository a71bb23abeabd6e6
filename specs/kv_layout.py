"""How a model's layers share one pool of KV-cache pages: its KV-cache groups, the bytes of one
pool page, and how many pages a request takes in each group (vLLM 0.32's hybrid KV cache
manager, `vllm/v1/core/kv_cache_utils.py`, with the default layer-outer cache layout).

    layout = kv_cache_groups(get_model("gpt-oss-120b"), block_size=16)
    layout.groups             # sliding_window(128) x18, full x18
    layout.page_bytes         # one pool page: 18 layers x 16 tokens x 2 KiB

How kvlab unifies page sizes
----------------------------
1. Layers are sorted into buckets of one kind (and one window): full attention, sliding
   window W, chunked local C, linear-attention state; in the order the layers first show them.
   With `hybrid_kv_cache_manager=False` (vLLM's `--disable-hybrid-kv-cache-manager`, and its
   behaviour on platforms without hybrid support) sliding and chunked layers count as full
   attention: they keep every token (`unify_hybrid_kv_cache_specs`).
2. One bucket: one group of all the layers (most models; exactly kvlab's old single page).
3. Several buckets (`_get_kv_cache_groups_uniform_page_size`): every group holds the same
   number of layers, the group size: the smallest bucket's layer count, or the largest's when
   that is under 1.5x the smallest. Each bucket splits into ceil(layers / group size) groups
   (layer i of the bucket to group i mod n); a group short of the group size is padded with
   empty layer slots that take memory all the same (vLLM warns "Add N padding layers").
4. Every layer's page has the same bytes. Attention layers of one model cache the same bytes
   per token, so their pages of `block_size` tokens are equal. A linear-attention state does
   not grow with tokens: for such models the attention block size is raised to the smallest
   multiple of max(16, block_size) whose attention page holds the state, and the state page is
   padded up to the attention page (`Platform._align_hybrid_block_size`; 16 is the smallest
   kernel block of FlashAttention and FlashInfer, `kernel_block_size`). Qwen3-Next at tp 1:
   a 1,097,728-byte state, 2,048 attention bytes per token, so 544-token pages.
5. One pool page (one block id) holds one page of each of the group size's layer slots, so
   it has `layers_per_group x layer page` bytes, and the pool is (KV memory // that) pages
   (`_get_kv_cache_bytes_per_block`, `get_kv_cache_config_from_groups`). Every group draws
   its block ids from the one pool.
6. A request of L tokens needs, per group (`max_memory_usage_bytes` / `page_size_bytes`):
   full ceil(L / B); sliding window ceil(min(W - 1 + F, L) / B) + 1; chunked local
   ceil(min(C + F, L) / B); state 1, or 2 with prefix caching (vLLM's mamba "align" mode);
   F is the tokens scheduled but not yet freed, max_num_batched_tokens x concurrent batches
   (2 with vLLM's default async scheduling, `VllmConfig.max_in_flight_tokens`). vLLM's
   "Maximum concurrency for L tokens per request" is the pool's pages over their sum over
   groups (`get_max_concurrency_for_kv_cache_config`).

Not modelled: vLLM's block-outer packed layout (`_get_packed_kv_cache_groups`, for backends
that ask for it), speculative-decoding blocks, and DeepSeek-V3.2's fp8 "ds_mla" latent format
(its `fp8_e4m3` latent is counted, not ds_mla's scale bytes); its indexer keys are counted
(`ModelSpec.kv_bytes_per_token_per_layer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.specs.kv_groups import GROUP_KINDS, KVCacheGroup
from kvlab.specs.model import LAYER_TYPES, ModelSpec, check_positive_tp

GROUP_KIND_OF_LAYER = dict(zip(LAYER_TYPES, GROUP_KINDS, strict=True))
# FlashAttention's and FlashInfer's smallest kernel block (vLLM: MultipleOf(16)).
KERNEL_BLOCK_SIZE = 16
# vLLM pads every group to the largest bucket's layer count while it is under 1.5x the smallest.
MAX_PADDING_RATIO = 1.5
# Batches in flight at once under vLLM's default async scheduling (pipeline parallel 1).
CONCURRENT_BATCHES = 2


def max_in_flight_tokens(max_num_batched_tokens: int, platform: str, *,
                         async_scheduling: bool = True) -> int:
    """Tokens scheduled but not yet settled (vLLM's `VllmConfig.max_in_flight_tokens`): a
    step's budget per batch in flight, two under async scheduling, which vLLM's CPU platform
    turns off (`CpuPlatform.check_and_update_config`); `platform` as `block_rules.platform_of`."""
    batches = CONCURRENT_BATCHES if async_scheduling and platform != "cpu" else 1
    return max_num_batched_tokens * batches


@dataclass(slots=True, frozen=True)
class LayoutGroup:
    """One KV-cache group of a layout: the fields of `KVCacheGroup` (kind,
    num_layers, window) and the bytes its layers take.

    `num_layers` counts model layers; `num_padding_layers` the empty slots vLLM adds to reach
    the layout's group size. `layer_page_bytes` is one layer's page as allocated (every group's
    alike), `layer_used_bytes` what the layer's data fills of it (less for a padded state).
    """

    kind: str
    num_layers: int
    window: int = 0
    num_padding_layers: int = 0
    layer_page_bytes: int = 0
    layer_used_bytes: int = 0

    @property
    def label(self) -> str:
        """The group in words, as `KVCacheGroup.label`: `full`, `sliding_window(128)`, ..."""
        return self.group.label

    @property
    def group(self) -> KVCacheGroup:
        """The group as the KV-cache manager takes it."""
        return KVCacheGroup(self.kind, self.num_layers, self.window)

    def pages_per_request(self, num_tokens: int, block_size: int, *,
                          max_in_flight_tokens: int | None = None,
                          enable_prefix_caching: bool = False) -> int:
        """Pool pages vLLM sets aside for a request of `num_tokens` tokens in this group
        (`KVCacheGroup.pages_per_request`)."""
        return self.group.pages_per_request(num_tokens, block_size,
                                            max_in_flight_tokens=max_in_flight_tokens,
                                            enable_prefix_caching=enable_prefix_caching)


@dataclass(slots=True, frozen=True)
class KVLayout:
    """A model's KV-cache groups on one device, all drawing from one pool of equal pages.

    `block_size` is the tokens of an attention page, raised above `requested_block_size` for
    models with linear-attention layers (see the module docstring). `page_bytes` is one pool
    page: `layers_per_group` layer pages of `layer_page_bytes`.
    """

    groups: tuple[LayoutGroup, ...]
    block_size: int
    requested_block_size: int
    layers_per_group: int
    layer_page_bytes: int
    tensor_parallel_size: int = 1

    @property
    def page_bytes(self) -> int:
        """Bytes of one pool page (one block id), every group's alike."""
        return self.layers_per_group * self.layer_page_bytes

    def pages_per_request(self, num_tokens: int, *, max_in_flight_tokens: int | None = None,
                          enable_prefix_caching: bool = False) -> tuple[int, ...]:
        """Pool pages a request of `num_tokens` tokens takes in each group (vLLM's rule)."""
        return tuple(g.pages_per_request(num_tokens, self.block_size,
                                         max_in_flight_tokens=max_in_flight_tokens,
                                         enable_prefix_caching=enable_prefix_caching)
                     for g in self.groups)

    def max_concurrency(self, num_pages: int, num_tokens: int, *,
                        max_in_flight_tokens: int | None = None,
                        enable_prefix_caching: bool = False) -> float:
        """Requests of `num_tokens` tokens that fit in `num_pages` pool pages at once: vLLM's
        `get_max_concurrency_for_kv_cache_config` (pages over their sum over groups)."""
        needed = sum(self.pages_per_request(num_tokens, max_in_flight_tokens=max_in_flight_tokens,
                                            enable_prefix_caching=enable_prefix_caching))
        return num_pages / needed


def kv_cache_groups(
    model: ModelSpec,
    block_size: int,
    tensor_parallel_size: int = 1,
    *,
    hybrid_kv_cache_manager: bool = True,
    kernel_block_size: int = KERNEL_BLOCK_SIZE,
) -> KVLayout:
    """The KV-cache groups of `model` with pages of `block_size` tokens on each of
    `tensor_parallel_size` devices, as vLLM forms them (module docstring).

    Tokens take the bytes of the model's `kv_cache_dtype` (`ModelSpec.with_kv_cache_dtype`).
    A model with every layer full attention gives one group of all layers and today's page
    (`block_size x kv_bytes_per_token`). Raises KvlabError for a bad block size or layer layout.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise KvlabError(f"block_size is {block_size!r}, expected a whole number >= 1",
                         parameters=("block_size",))
    check_positive_tp(tensor_parallel_size)
    problem = layer_layout_problem(model)
    if problem:
        raise KvlabError(f"model {model.name!r}: {problem}", parameters=("model",))
    windows = {"sliding_attention": model.sliding_window or 0,
               "chunked_attention": model.attention_chunk_size or 0}
    kinds = list(model.layer_kinds)
    if not hybrid_kv_cache_manager:
        kinds = ["full_attention" if k in windows else k for k in kinds]

    token_bytes = 0
    if any(k != "linear_attention" for k in kinds):
        token_bytes = model.kv_bytes_per_token_per_layer(tensor_parallel_size)
    state_bytes = model.linear_state_bytes_per_device(tensor_parallel_size)
    page_tokens = block_size
    if state_bytes and token_bytes and page_tokens * token_bytes < state_bytes:
        align = max(kernel_block_size, block_size)
        page_tokens = align * -(-state_bytes // (align * token_bytes))
    layer_page_bytes = page_tokens * token_bytes if token_bytes else state_bytes

    group_size, grouped = group_layers([(kind, windows.get(kind, 0)) for kind in kinds])
    groups = []
    for (kind, window), layers in grouped:
        used = state_bytes if kind == "linear_attention" else layer_page_bytes
        groups.append(LayoutGroup(GROUP_KIND_OF_LAYER[kind], len(layers), window,
                                  group_size - len(layers), layer_page_bytes, used))
    return KVLayout(tuple(groups), page_tokens, block_size, group_size, layer_page_bytes,
                    tensor_parallel_size)


def group_layers(layers: Sequence[tuple[str, int]],
                 ) -> tuple[int, list[tuple[tuple[str, int], list[int]]]]:
    """vLLM's grouping of layers given as (layer type, window) in model order (module
    docstring, steps 1-3): the group size, and each group's (layer type, window) and layer
    indices, buckets in the order the layers first show them, layer i of a bucket in its
    group i mod (the bucket's groups)."""
    buckets: dict[tuple[str, int], list[int]] = {}
    for index, key in enumerate(layers):
        buckets.setdefault(key, []).append(index)
    counts = [len(indices) for indices in buckets.values()]
    group_size = min(counts)
    if max(counts) < min(counts) * MAX_PADDING_RATIO:
        group_size = max(counts)
    grouped = []
    for key, indices in buckets.items():
        num_groups = -(-len(indices) // group_size)
        grouped += [(key, indices[first::num_groups]) for first in range(num_groups)]
    return group_size, grouped


def layer_group_ids(layers: Sequence[tuple[str, int]]) -> tuple[tuple[KVCacheGroup, ...],
                                                                   tuple[int, ...]]:
    """The KV-cache groups of layers given as (layer type, window), and each layer's group
    (`group_layers`): what the engine's manager and model runner take."""
    _, grouped = group_layers(layers)
    ids = [0] * len(layers)
    for group_id, (_, indices) in enumerate(grouped):
        for index in indices:
            ids[index] = group_id
    groups = tuple(KVCacheGroup(GROUP_KIND_OF_LAYER[kind], len(indices), window)
                   for (kind, window), indices in grouped)
    return groups, tuple(ids)


def layer_summary(model: ModelSpec) -> str:
    """The model's layers by group kind in `kvlab.specs.kv_groups.parse_groups` words, in
    the order they first appear: `sliding_window(128)x18,fullx18`."""
    windows = {"sliding_attention": model.sliding_window or 0,
               "chunked_attention": model.attention_chunk_size or 0}
    counts: dict[str, int] = {}
    for kind in model.layer_kinds:
        window = windows.get(kind, 0)
        word = GROUP_KIND_OF_LAYER[kind] + (f"({window})" if window else "")
        counts[word] = counts.get(word, 0) + 1
    return ",".join(f"{word}x{count}" for word, count in counts.items())


def layer_layout_problem(model: ModelSpec) -> str | None:
    """What makes a model's layer layout inconsistent (words, count, windows, state, sparse
    attention), or None when it is sound."""
    types = model.layer_types
    if types and len(types) != model.num_layers:
        return (f"layer_types lists {len(types)} layers, num_layers is {model.num_layers}; "
                "give one word per layer")
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        return f"layer_types has {unknown[0]!r}; expected one of {', '.join(LAYER_TYPES)}"
    needs = (("sliding_attention", "sliding_window", model.sliding_window),
             ("chunked_attention", "attention_chunk_size", model.attention_chunk_size),
             ("linear_attention", "linear_state_bytes", model.linear_state_bytes))
    for kind, field, value in needs:
        if kind in types and (value is None or value < 1):
            return f"layer_types has {kind} layers but {field} is {value!r}; expected >= 1"
    if (model.index_topk is not None or model.index_head_dim is not None) and not model.is_mla:
        return "index_topk and index_head_dim (sparse MLA, DeepSeek-V3.2) need kv_lora_rank"
    return None

