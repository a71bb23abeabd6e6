"""What one simulation runs: `SimConfig`, and the model, hardware, policy and KV capacity it
resolves to."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import PolicySpec, SchedulerConfig, parse_policy
from kvlab.sim.calibrated import load_cost_model
from kvlab.specs import (
    HardwareSpec,
    KVCapacity,
    ModelSpec,
    get_hardware,
    get_model,
    kv_cache_capacity_tokens,
)


@dataclass(slots=True)
class SimConfig:
    """One simulated serving instance: model and hardware presets, memory policy, batch limits.

    `model` and `hardware` are preset names (or spec-file paths, or specs); `policy` may be given
    as a spec string and is parsed on construction. KV memory is
    `gpu_memory_utilization` of HBM minus weights and an activation reserve, as vLLM sizes it,
    unless `num_gpu_blocks_override` sets the page count. `max_model_len` defaults to the model's.
    `enable_prefix_caching` turns the policy's eviction `none` into `lru` (a policy naming its
    eviction keeps it). `cost_model` is the path of a calibrated cost model (`kvlab calibrate`)
    used instead of the roofline. `seed` is recorded with the result: the simulation itself has no
    randomness (it shaped the trace's arrivals).
    """

    model: str | ModelSpec = "llama-2-7b"
    hardware: str | HardwareSpec = "a100-80g"
    tensor_parallel_size: int = 1
    policy: PolicySpec | str = field(default_factory=PolicySpec)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    cost_model: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        self.policy = parse_policy(self.policy)  # a bad spec fails here, not mid-run

    def with_policy(self, policy: PolicySpec | str) -> SimConfig:
        """A copy running another policy."""
        return replace(self, policy=parse_policy(policy))

    def model_spec(self) -> ModelSpec:
        """The model preset (or file) this config names."""
        return self.model if isinstance(self.model, ModelSpec) else get_model(self.model)

    def hardware_spec(self) -> HardwareSpec:
        """The hardware preset (or file) this config names."""
        if isinstance(self.hardware, HardwareSpec):
            return self.hardware
        return get_hardware(self.hardware)

    def effective_policy(self) -> PolicySpec:
        """The policy as simulated: prefix caching switched on when asked for."""
        policy = parse_policy(self.policy)
        if self.enable_prefix_caching and policy.eviction == "none":
            policy = policy.with_options(eviction="lru")
        return policy

    def effective_max_model_len(self) -> int:
        """`max_model_len`, or the model's own when unset."""
        limit = self.model_spec().max_model_len
        if self.max_model_len is None:
            return limit
        if not 1 <= self.max_model_len <= limit:
            raise KvlabError(
                f"--max-model-len is {self.max_model_len}; expected 1 to {limit}, the "
                f"context length of model {self.model_spec().name!r}"
            )
        return self.max_model_len

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's limits (validated there)."""
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.effective_max_model_len(),
            enable_chunked_prefill=self.enable_chunked_prefill,
        )

    def check(self) -> None:
        """Raise a KvlabError naming the flag of the first bad setting, before any work."""
        self.scheduler_config()
        self.kv_capacity()
        if self.cost_model is not None:
            load_cost_model(self.cost_model)

    def kv_capacity(self) -> KVCapacity:
        """The KV cache of one device for this config's policy page size."""
        return kv_cache_capacity_tokens(
            self.model_spec(),
            self.hardware_spec(),
            page_size=self.effective_policy().block_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            tensor_parallel_size=self.tensor_parallel_size,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
        )

    def metadata(self) -> dict[str, Any]:
        """The config as saved with a result (JSON-ready; names, not specs); `cost_model` only
        when a calibrated one is named (the roofline's results keep their keys)."""
        policy = self.effective_policy()
        calibrated = {} if self.cost_model is None else {"cost_model": self.cost_model}
        return {
            **calibrated,
            "policy": policy.to_string(),
            "policy_json": policy.to_json(),
            "model": self.model_spec().name,
            "hardware": self.hardware_spec().name,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.effective_max_model_len(),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "num_gpu_blocks_override": self.num_gpu_blocks_override,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "enable_prefix_caching": policy.prefix_caching,
            "seed": self.seed,
        }
