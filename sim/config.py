"""What one simulation runs: `SimConfig`, a serving config on a model and hardware preset,
resolved once (presets read, policy parsed, KV capacity sized, cost model loaded)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvlab.errors import KvlabError
from kvlab.policies import KVCacheManager, PolicySpec, SchedulerConfig
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import AUTO_BLOCK, PrefixTier
from kvlab.sim.calibrated import CalibratedCostModel, load_cost_model
from kvlab.specs import (
    HardwareSpec,
    KVCapacity,
    ModelSpec,
    get_hardware,
    get_model,
    kv_cache_capacity_tokens,
)
from kvlab.specs.block_rules import platform_of
from kvlab.specs.capacity import device_name
from kvlab.specs.host import available_ram_bytes
from kvlab.specs.kv_groups import KVCacheGroup
from kvlab.specs.kv_layout import max_in_flight_tokens

if TYPE_CHECKING:
    from kvlab.traces import Trace


@dataclass(slots=True)
class SimConfig:
    """One simulated serving instance: a model and a hardware preset running a serving config.

    `model` and `hardware` are preset names, spec-file paths or specs; they are read once, on
    construction, into `model_spec` and `hardware_spec`. KV memory is the serving config's
    `gpu_memory_utilization` of HBM minus weights and an activation reserve, as vLLM sizes it,
    unless `num_gpu_blocks_override` sets the page count (`capacity`); `max_model_len` is the
    serving config's, or the model's. `cost_model` is the path of a calibrated cost model
    (`kvlab calibrate`), loaded into `calibrated` and used instead of the roofline. The serving
    config's `seed` is recorded with the result: the simulation itself has no randomness.
    Every setting is checked here: a bad one fails before any work.

    KV-cache groups: a model whose layers keep different caches (sliding window, chunked local,
    linear-attention state) runs vLLM's hybrid KV cache manager over the groups of its layout
    (`kv_cache_groups`), with pages of the layout's block size (raised for linear-attention
    models: the policy's block size follows it), under the serving config's
    `prefix_cache_retention_interval` and `hybrid_kv_cache_manager` (vLLM's settings).
    """

    model: str | ModelSpec = "llama-2-7b"
    hardware: str | HardwareSpec = "a100-80g"
    serving: ServingConfig = field(default_factory=ServingConfig)
    tensor_parallel_size: int = 1
    cost_model: str | None = None
    model_spec: ModelSpec = field(init=False)
    hardware_spec: HardwareSpec = field(init=False)
    max_model_len: int = field(init=False)
    capacity: KVCapacity = field(init=False)
    calibrated: CalibratedCostModel | None = field(init=False)

    def __post_init__(self) -> None:
        model, hardware = self.model, self.hardware
        spec = model if isinstance(model, ModelSpec) else get_model(model)
        self.model_spec = spec.with_kv_cache_dtype(self.serving.kv_cache_dtype)
        self.hardware_spec = (
            hardware if isinstance(hardware, HardwareSpec) else get_hardware(hardware)
        )
        spec = self.model_spec
        self.max_model_len = self.serving.resolve_max_model_len(spec.max_model_len, spec.name)
        self._resolve_memory()
        self.calibrated = None if self.cost_model is None else load_cost_model(self.cost_model)

    @property
    def policy(self) -> PolicySpec:
        """The policy simulated (the serving config's)."""
        return self.serving.policy

    def with_policy(self, policy: PolicySpec | str) -> SimConfig:
        """A copy running another policy (presets and cost model are not read again)."""
        other = copy.copy(self)
        other.serving = self.serving.with_policy(policy)
        other._resolve_memory()
        return other

    def with_tier_pages_for(self, trace: Trace) -> SimConfig:
        """This config with its tier page size settled for `trace`'s prefix keys where it is
        `auto` (`TiersConfig.for_prefix_blocks`; one device page with KV-cache groups, whose
        tier pages hold one); itself where there is nothing to settle."""
        tiers = self.serving.kv_tiers
        if not tiers or tiers.block_size != AUTO_BLOCK:  # (no pass over the trace for them)
            return self
        blocks = None if self.kv_cache_groups is not None else trace.prefix_block_size()
        other = copy.copy(self)
        other.serving = replace(self.serving, kv_tiers=tiers.for_prefix_blocks(
            self.policy.block_size, blocks))
        return other

    @property
    def prefix_cache_retention_interval(self) -> int | None:
        """The serving config's (vLLM's `prefix_cache_retention_interval`)."""
        return self.serving.prefix_cache_retention_interval

    @property
    def hybrid_kv_cache_manager(self) -> bool:
        """The serving config's (False: vLLM's `--disable-hybrid-kv-cache-manager`)."""
        return self.serving.hybrid_kv_cache_manager

    @property
    def kv_cache_groups(self) -> list[KVCacheGroup] | None:
        """The KV-cache groups the manager keeps, one block table each; None for one
        full-attention group (a plain model, or hybrid_kv_cache_manager off)."""
        layout = self.capacity.layout
        if layout is None or [g.kind for g in layout.groups] == ["full"]:
            return None
        return [g.group for g in layout.groups]

    def startup_lines(self) -> list[str]:
        """vLLM's start-up lines for this instance: its KV cache and how many requests of
        max_model_len fit at once, counted as vLLM counts them on the hardware's platform."""
        platform = platform_of(self.hardware_spec)
        in_flight = max_in_flight_tokens(self.serving.max_num_batched_tokens, platform)
        return self.capacity.startup_lines(
            self.max_model_len, device=device_name(platform), max_in_flight_tokens=in_flight,
            enable_prefix_caching=self.serving.policy.prefix_caching)

    @property
    def page_bytes(self) -> int:
        """Bytes of one KV page on one device: all layers, K and V; for a model with KV-cache
        groups, a page of the pool (one group's share of the layers, `KVCapacity.page_bytes`),
        which is what a tier page, a swap or a transfer moves."""
        if self.kv_cache_groups is not None:
            return self.capacity.page_bytes
        return self.model_spec.kv_bytes_per_token(self.tensor_parallel_size) * \
            self.serving.page_size

    def tier_links(self) -> list[tuple[float, float, float]]:
        """(read bytes/s, write bytes/s, seconds per transfer) of each memory tier's link: the
        tier's own figures where its spec gives them, else the hardware's for its kind."""
        links = []
        for tier in self.serving.kv_tiers.tiers:
            read, write, latency = self.hardware_spec.tier_link(tier.kind)
            links.append((tier.read_bandwidth or read, tier.write_bandwidth or write,
                          latency if tier.latency_s is None else tier.latency_s))
        return links

    def tier_warnings(self) -> list[str]:
        """A host tier larger than the host memory the hardware preset gives a device."""
        host_bytes = self.hardware_spec.host_memory_bytes
        warnings = []
        for tier in self.serving.kv_tiers.tiers:
            size = tier.num_pages(self.page_bytes) * self.page_bytes
            if tier.kind == "host" and host_bytes is not None and size > host_bytes:
                warnings.append(
                    f"host tier of {size / 2**30:.0f} GiB is more than the "
                    f"{host_bytes / 2**30:.0f} GiB of host memory per device of "
                    f"{self.hardware_spec.name}")
        return warnings

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's limits."""
        return self.serving.scheduler_config(self.max_model_len)

    def metadata(self) -> dict[str, Any]:
        """The config as saved with a result (JSON-ready; names, not specs); `cost_model` only
        when a calibrated one is named, the KV-cache groups and the retention interval (None
        too) for a hybrid model (the roofline's results and plain models' keep their keys)."""
        calibrated = {} if self.cost_model is None else {"cost_model": self.cost_model}
        groups = self.kv_cache_groups
        hybrid: dict[str, Any] = {} if groups is None else {
            "kv_cache_groups": [g.label for g in groups],
            "prefix_cache_retention_interval": self.prefix_cache_retention_interval,
        }
        return {
            **calibrated,
            "model": self.model_spec.name,
            "hardware": self.hardware_spec.name,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            **self.serving.result_metadata(),
            **hybrid,
        }

    def _resolve_memory(self) -> None:
        """Capacity for the policy; the policy's block size raised to the layout's; the
        manager's refusals (a policy or setting the groups cannot run) before any work."""
        self.capacity = self._capacity()
        block_size = self.capacity.page_size
        if block_size != self.serving.page_size:  # raised for a linear-attention state
            self.serving = self.serving.with_policy(
                self.policy.with_options(block_size=block_size))
        groups = self.kv_cache_groups
        interval = self.prefix_cache_retention_interval
        if interval is not None and interval % block_size:
            raise KvlabError(
                f"prefix_cache_retention_interval is {interval}: expected None, 0 or a multiple "
                f"of the block size, {block_size} tokens",
                parameters=("prefix_cache_retention_interval",))
        if groups is not None:
            self._check_manager(groups)

    def _check_manager(self, groups: list[KVCacheGroup]) -> None:
        """Raise the KvlabError the hybrid manager gives for this config, on a one-page
        manager (its checks run on construction), with one-page tiers of the same settings."""
        if self.policy.precision != "none":  # before the manager's word on the ladder
            raise KvlabError(
                f"--policy precision={self.policy.precision}: demotion needs one KV-cache "
                f"group; model {self.model_spec.name!r} has {len(groups)} (hybrid); pass "
                "--disable-hybrid-kv-cache-manager to run every layer as full attention",
                parameters=("policy",))
        tier_config = self.serving.kv_tiers
        tiers = [PrefixTier(spec, 1, tier_config.block_pages(self.serving.page_size))
                 for spec in tier_config.tiers]
        try:
            KVCacheManager(self.policy, 1, max_model_len=self.max_model_len, groups=groups,
                           retention_interval=self.prefix_cache_retention_interval,
                           tiers=tiers or None, tier_config=tier_config)
        except KvlabError as err:
            raise KvlabError(
                f"model {self.model_spec.name!r} has KV-cache groups "
                f"({', '.join(g.label for g in groups)}): {err}; or disable the hybrid KV "
                "cache manager (every layer then keeps every token)",
                parameters=err.parameters) from None

    def _capacity(self) -> KVCapacity:
        """The KV cache of one device for this config's policy page size; a KvlabError when
        the simulator's own books for that many pages would not fit in this machine's RAM."""
        serving = self.serving
        capacity = kv_cache_capacity_tokens(
            self.model_spec,
            self.hardware_spec,
            page_size=serving.page_size,
            gpu_memory_utilization=serving.gpu_memory_utilization,
            tensor_parallel_size=self.tensor_parallel_size,
            num_gpu_blocks_override=serving.num_gpu_blocks_override,
            kv_cache_memory_bytes=serving.kv_cache_memory_bytes,
            hybrid_kv_cache_manager=self.hybrid_kv_cache_manager,
        )
        _check_books_fit(capacity.num_pages)
        return capacity


# What the manager keeps per page (free list, reference counts, tables): about 40 bytes
# measured at 10 million pages; with room for the rest of a run.
BOOK_BYTES_PER_PAGE = 64


def _check_books_fit(num_pages: int) -> None:
    available = available_ram_bytes()
    if num_pages * BOOK_BYTES_PER_PAGE > available:
        raise KvlabError(
            f"{num_pages:,} KV pages: the simulator's books for them need about "
            f"{num_pages * BOOK_BYTES_PER_PAGE / 2**30:.1f} GiB, more than the "
            f"{available / 2**30:.1f} GiB of RAM available; lower num_gpu_blocks_override "
            "or raise block_size",
            parameters=("num_gpu_blocks_override", "block_size"))

