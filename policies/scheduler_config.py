"""The scheduler's batch limits and admission settings, checked on creation (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError
from kvlab.policies.scheduling.spec import DEFAULT_SCHEDULING_POLICY, make_order

# The defaults of every world's config (ServingConfig composes these limits).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    """Batch limits: requests per step, tokens per step, model length, chunked prefill; and
    `reserve_full_isl`: admit a waiting request only when its whole known sequence (prompt
    and the output it has so far) would fit in KV memory now, not just its first chunk
    (vLLM's `--scheduler-reserve-full-isl`, on by default since vLLM 0.32);
    `scheduling_policy`: the order waiting requests are admitted in (`kvlab.policies.scheduling`:
    fcfs, priority, lpm, sjf, ...; vLLM's `--scheduling-policy`)."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    reserve_full_isl: bool = False
    scheduling_policy: str = DEFAULT_SCHEDULING_POLICY

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            check_whole_number(name, getattr(self, name), 1)
        make_order(self.scheduling_policy)  # a KvlabError for a spec it does not name
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise KvlabError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with enable_chunked_prefill off: long "
                "prompts could never be scheduled; raise it or enable chunked prefill",
                parameters=("max_num_batched_tokens", "max_model_len", "enable_chunked_prefill"),
            )


def check_whole_number(name: str, value: object, low: int) -> None:
    """Raise a KvlabError naming `name` unless `value` is a whole number >= `low`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise KvlabError(f"{name} is {value!r}; expected a whole number >= {low}",
                         parameters=(name,))
