"""The engine's settings (vLLM's names) and the memory-size parser its flags use."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvlab.engine.kv_cache import DEFAULT_SWAP_SPACE_BYTES
from kvlab.errors import KvlabError
from kvlab.policies.spec import PolicySpec, parse_policy

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_memory_size(value: str | int, flag: str = "--kv-cache-memory") -> int:
    """Bytes from an int or a string such as "256MiB", "1.5GB" or "4096" (plain bytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise KvlabError(f"{flag} {value}: expected bytes >= 0")
        return value
    match = _SIZE.match(str(value))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise KvlabError(
            f"{flag} {value!r}: expected a size such as 256MiB, 2GiB, 500MB or a number of bytes"
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """Everything `LLMEngine` is built from; the names and defaults follow vLLM.

    `policy` is a policy spec (string, dict or PolicySpec); `block_size`, when given, overrides
    its page size. `max_model_len` None means the model's limit. `kv_cache_memory_bytes` sizes
    the KV cache directly (the way to size it on cpu); `num_gpu_blocks_override` fixes the page
    count. `swap_space_bytes` bounds host swap pages unless the spec's `host_pages` does.
    `preemption_costs` replaces the startup measurement that `preemption=auto` otherwise runs.
    `step_timer` is how a step's duration is measured: `wall` (perf_counter), or `cpu`: the
    engine thread's CPU time, which ignores time other processes hold the cores. `cpu` is exact
    only on the cpu device with one torch thread (the caller sets torch.set_num_threads(1)).
    `warmup` runs the largest prefill a step can hold and a batch of up to 8 decodes once at
    start-up (ModelRunner.warm_up), so that the first steps measured are not slowed by one-off
    costs; it changes no output and no decision.
    """

    model: str
    device: str = "cpu"
    policy: Any = "paged"
    block_size: int | None = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    attention_backend: str = "torch"
    dtype: str | None = None
    seed: int = 0
    preemption_costs: Any = None
    step_timer: str = "wall"
    warmup: bool = True

    def policy_spec(self) -> PolicySpec:
        """The policy with this config's page size and prefix-caching switch applied."""
        spec = parse_policy(self.policy)
        if self.block_size is not None:
            if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
                raise KvlabError(f"--block-size {self.block_size!r}: expected a whole number")
            spec = spec.with_options(block_size=self.block_size)
        if self.enable_prefix_caching and spec.eviction == "none":
            spec = spec.with_options(eviction="lru")  # vLLM's prefix cache evicts LRU
        return spec
