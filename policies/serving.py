"""`ServingConfig`: how one serving instance runs, the same in every world that runs one.

The simulator's `SimConfig`, the engine's `EngineConfig`, the server and the dashboard all
compose this one object, so a setting has one name, one default and one check, and the policy
it runs is resolved once: page size and prefix caching are folded into the `PolicySpec` here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies.scheduler_config import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    SchedulerConfig,
    check_whole_number,
)
from kvlab.policies.scheduling.spec import DEFAULT_SCHEDULING_POLICY, canonical_scheduling_policy
from kvlab.policies.spec import PolicySpec, parse_policy
from kvlab.policies.tiers import TiersConfig
from kvlab.specs.kv_dtype import kv_cache_dtype

GiB = 2**30
DEFAULT_SWAP_SPACE_BYTES = 4 * GiB  # vLLM v0's swap_space default, per device
_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_memory_size(value: str | int, parameter: str = "kv_cache_memory_bytes",
                      bare_unit: str = "b") -> int:
    """Bytes from an int or a string such as "256MiB", "1.5GB" or "4096" (a plain number is
    in `bare_unit`: bytes, or "gib" for vLLM's --swap-space); a KvlabError about `parameter`
    otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise KvlabError(f"{parameter} {value}: expected bytes >= 0", parameters=(parameter,))
        return value * _UNITS[bare_unit]
    match = _SIZE.match(str(value))
    unit = (match.group(2).lower() or bare_unit) if match else ""
    if match is None or unit not in _UNITS:
        raise KvlabError(
            f"{parameter} {value!r}: expected a size such as 256MiB, 2GiB, 500MB or a number "
            + ("of bytes" if bare_unit == "b" else f"(in {bare_unit[0].upper()}iB)"),
            parameters=(parameter,),
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(slots=True, frozen=True)
class ServingConfig:
    """The memory policy, the scheduler's limits and how KV memory is sized (vLLM's names).

    `policy` is the policy as run (see `create` for the page-size and prefix-caching
    switches). `max_model_len` None means the model's own limit (`resolve_max_model_len`).
    `scheduler_reserve_full_isl`: admit a waiting request only when its whole prompt would fit,
    not just its first chunk (vLLM V1's default, as the other defaults are: the `vllm`
    preset, `kvlab.policies.serving_presets`; `vllm-v0` turns it off). KV memory:
    `num_gpu_blocks_override` pages; else `kv_cache_memory_bytes`; else
    `gpu_memory_utilization` of the device minus weights and activations. `swap_space_bytes`
    bounds the host swap pages unless the policy's `host_pages` does. `kv_tiers` are the memory
    tiers below the device that the prefix cache spills to (policies/tiers/; none by
    default). `kv_cache_dtype` is the KV cache's precision (vLLM's `--kv-cache-dtype` names,
    `kvlab.specs.kv_dtype`; an alias is stored as its full name). `scheduling_policy` is the
    order waiting requests are admitted in (vLLM's `--scheduling-policy`: fcfs, priority; and
    SGLang's lpm, sjf, ...: `kvlab.policies.scheduling`; stored canonical). A model with
    KV-cache groups (sliding window, chunked local, linear-attention state) runs vLLM's hybrid
    KV cache manager: `prefix_cache_retention_interval` is vLLM's setting of that name
    (tokens: None, every page leaving a window stays cached; 0, only what a hit at a prompt's
    end needs, vLLM 0.32's default; R, that and what a hit at each multiple of R needs; a
    multiple of the block size); `hybrid_kv_cache_manager` False is vLLM's
    `--disable-hybrid-kv-cache-manager` (every attention layer keeps every token: one full
    group). `seed` shapes sampling and synthetic workloads and is recorded with results.
    Checked on construction.
    """

    policy: PolicySpec = field(default_factory=PolicySpec)
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES
    seed: int = 0
    kv_tiers: TiersConfig = field(default_factory=TiersConfig)
    kv_cache_dtype: str = "auto"
    scheduling_policy: str = DEFAULT_SCHEDULING_POLICY
    prefix_cache_retention_interval: int | None = None
    hybrid_kv_cache_manager: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.policy, PolicySpec):
            raise TypeError("ServingConfig.policy is a PolicySpec; use ServingConfig.create")
        # frozen: store the full name of an alias (fp8 -> fp8_e4m3), as vLLM resolves it
        object.__setattr__(self, "kv_cache_dtype", kv_cache_dtype(self.kv_cache_dtype).name)
        object.__setattr__(self, "scheduling_policy",
                           canonical_scheduling_policy(self.scheduling_policy))
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            check_whole_number(name, getattr(self, name), 1)
        self._check_group_settings()
        if not isinstance(self.scheduler_reserve_full_isl, bool):
            raise KvlabError(f"scheduler_reserve_full_isl is {self.scheduler_reserve_full_isl!r}; "
                             "expected true or false", parameters=("scheduler_reserve_full_isl",))
        for name, low in (("max_model_len", 1), ("num_gpu_blocks_override", 1),
                          ("kv_cache_memory_bytes", 0)):
            if getattr(self, name) is not None:
                check_whole_number(name, getattr(self, name), low)
        check_whole_number("swap_space_bytes", self.swap_space_bytes, 0)
        utilization = self.gpu_memory_utilization
        if not (isinstance(utilization, int | float) and 0 < utilization <= 1):
            raise KvlabError(
                f"gpu_memory_utilization is {utilization!r}; expected a fraction in (0, 1]",
                parameters=("gpu_memory_utilization",),
            )
        if not isinstance(self.kv_tiers, TiersConfig):
            raise TypeError("ServingConfig.kv_tiers is a TiersConfig")
        if self.kv_tiers and not self.policy.prefix_caching:
            raise KvlabError(
                "memory tiers (kv_tiers) hold prefix-cache pages: enable prefix caching "
                f"(policy {self.policy.to_string()!r} caches nothing)",
                parameters=("kv_tiers", "enable_prefix_caching"))
        self.kv_tiers.block_pages(self.page_size)  # a KvlabError for a block the pages can't make
        limit = self.max_model_len
        if (limit is not None and not self.enable_chunked_prefill
                and self.max_num_batched_tokens < limit):
            raise _prefill_budget_error(self.max_num_batched_tokens, limit)

    def _check_group_settings(self) -> None:
        """The KV-cache group settings' types (the interval's multiple of the block size is
        checked where the block size is final: `SimConfig`, the engine)."""
        interval = self.prefix_cache_retention_interval
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int)
                                     or interval < 0):
            raise KvlabError(
                f"prefix_cache_retention_interval is {interval!r}: expected None (cache every "
                "page leaving a sliding window), 0 (only what a hit at a prompt's end needs) "
                "or a multiple of the block size",
                parameters=("prefix_cache_retention_interval",))
        if not isinstance(self.hybrid_kv_cache_manager, bool):
            raise KvlabError(f"hybrid_kv_cache_manager is {self.hybrid_kv_cache_manager!r}: "
                             "expected true or false", parameters=("hybrid_kv_cache_manager",))

    @classmethod
    def create(
        cls,
        policy: PolicySpec | str | dict[str, Any] = "paged",
        *,
        block_size: int | None = None,
        enable_prefix_caching: bool = False,
        **settings: Any,
    ) -> ServingConfig:
        """The config with `policy` parsed and resolved once: `block_size` sets its page size
        (unless the spec sets another one), `enable_prefix_caching` turns eviction `none` into
        `lru` (vLLM's prefix cache); `settings` are the other fields."""
        spec = parse_policy(policy)
        if block_size is not None:
            if isinstance(block_size, bool) or not isinstance(block_size, int):
                raise KvlabError(f"block_size {block_size!r}: expected a whole number",
                                 parameters=("block_size",))
            if spec.block_size not in (PolicySpec().block_size, block_size):
                raise KvlabError(
                    f"block_size {block_size} contradicts policy {spec.to_string()!r}, whose "
                    f"pages hold {spec.block_size} tokens; give the page size once",
                    parameters=("block_size",),
                )
            spec = spec.with_options(block_size=block_size)
        if enable_prefix_caching and spec.eviction == "none":
            spec = spec.with_options(eviction="lru")
        return cls(policy=spec, **settings)

    def with_policy(self, policy: PolicySpec | str) -> ServingConfig:
        """A copy running another policy."""
        return replace(self, policy=parse_policy(policy))

    @property
    def page_size(self) -> int:
        """Token slots per KV page (the policy's block_size)."""
        return self.policy.block_size

    def resolve_max_model_len(self, model_limit: int, model_name: str) -> int:
        """`max_model_len`, or the model's own limit when unset; more than the model's limit is
        an error (a model cannot attend past it)."""
        limit = self.max_model_len
        if limit is None:
            limit = model_limit
        elif limit > model_limit:
            raise KvlabError(
                f"max_model_len is {limit}; expected 1 to {model_limit}, the context length "
                f"of model {model_name!r}",
                parameters=("max_model_len",),
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < limit:
            raise _prefill_budget_error(self.max_num_batched_tokens, limit)
        return limit

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The scheduler's limits for a model length resolved by `resolve_max_model_len`."""
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            reserve_full_isl=self.scheduler_reserve_full_isl,
            scheduling_policy=self.scheduling_policy,
        )

    def num_host_pages(self, num_pages: int, swap_space_pages: int | None = None) -> int:
        """Host swap pages: none for a policy that never swaps; else the policy's `host_pages`;
        else as many as the device has pages, within `swap_space_pages`: the pages that
        `swap_space_bytes` holds (vLLM V0's --swap-space, per device), where the caller
        knows a page's bytes (the engine and the simulator pass them)."""
        policy = self.policy
        if policy.preemption == "recompute":
            return 0
        if policy.host_pages is not None:
            return policy.host_pages
        return num_pages if swap_space_pages is None else min(num_pages, swap_space_pages)

    def result_metadata(self) -> dict[str, Any]:
        """The settings as saved with a run's result, under vLLM's names (JSON-ready; the
        simulator and the engine add their own keys): the KV cache's size and dtype (when not
        auto), the scheduling policy (when not fcfs), the admission gate, the tiers, the
        retention interval and the hybrid manager's switch only when set (the stored results of
        runs without them keep their keys; the admission gate is always said since it became
        the default)."""
        policy = self.policy
        return {
            "policy": policy.to_string(),
            "policy_json": policy.to_json(),
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "num_gpu_blocks_override": self.num_gpu_blocks_override,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "enable_prefix_caching": policy.prefix_caching,
            "seed": self.seed,
            **({"kv_cache_dtype": self.kv_cache_dtype} if self.kv_cache_dtype != "auto" else {}),
            **({"scheduling_policy": self.scheduling_policy}
               if self.scheduling_policy != DEFAULT_SCHEDULING_POLICY else {}),
            **({"kv_cache_memory_bytes": self.kv_cache_memory_bytes}
               if self.kv_cache_memory_bytes is not None else {}),
            "scheduler_reserve_full_isl": self.scheduler_reserve_full_isl,
            **({"kv_tiers": self.kv_tiers.to_json()} if self.kv_tiers else {}),
            **({"prefix_cache_retention_interval": self.prefix_cache_retention_interval}
               if self.prefix_cache_retention_interval is not None else {}),
            **({"hybrid_kv_cache_manager": False} if not self.hybrid_kv_cache_manager else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """Every field, the policy and the tiers as dicts (`from_json` reads it back)."""
        return {**asdict(self), "kv_tiers": self.kv_tiers.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServingConfig:
        """The config a `to_json` dict describes."""
        data = dict(data)
        tiers = TiersConfig.from_json(data.pop("kv_tiers", None))
        return cls(policy=PolicySpec.from_json(data.pop("policy", {})), kv_tiers=tiers, **data)


def _prefill_budget_error(budget: int, max_model_len: int) -> KvlabError:
    return KvlabError(
        f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}) with "
        "enable_chunked_prefill off: long prompts could never be scheduled; raise it or "
        "enable chunked prefill",
        parameters=("max_num_batched_tokens", "max_model_len", "enable_chunked_prefill"),
    )
