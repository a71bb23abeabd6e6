"""What one simulation runs: `SimConfig`, a serving config on a model and hardware preset,
resolved once (presets read, policy parsed, KV capacity sized, cost model loaded)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import PolicySpec, SchedulerConfig
from kvlab.policies.serving import ServingConfig
from kvlab.sim.calibrated import CalibratedCostModel, load_cost_model
from kvlab.specs import (
    HardwareSpec,
    KVCapacity,
    ModelSpec,
    get_hardware,
    get_model,
    kv_cache_capacity_tokens,
)
from kvlab.specs.host import available_ram_bytes


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
        self.model_spec = model if isinstance(model, ModelSpec) else get_model(model)
        self.hardware_spec = (
            hardware if isinstance(hardware, HardwareSpec) else get_hardware(hardware)
        )
        spec = self.model_spec
        self.max_model_len = self.serving.resolve_max_model_len(spec.max_model_len, spec.name)
        self.capacity = self._capacity()
        self.calibrated = None if self.cost_model is None else load_cost_model(self.cost_model)

    @property
    def policy(self) -> PolicySpec:
        """The policy simulated (the serving config's)."""
        return self.serving.policy

    def with_policy(self, policy: PolicySpec | str) -> SimConfig:
        """A copy running another policy (presets and cost model are not read again)."""
        other = copy.copy(self)
        other.serving = self.serving.with_policy(policy)
        other.capacity = other._capacity()
        return other

    @property
    def page_bytes(self) -> int:
        """Bytes of one KV page on one device (all layers, K and V)."""
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
        when a calibrated one is named (the roofline's results keep their keys)."""
        calibrated = {} if self.cost_model is None else {"cost_model": self.cost_model}
        return {
            **calibrated,
            "model": self.model_spec.name,
            "hardware": self.hardware_spec.name,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            **self.serving.result_metadata(),
        }

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

