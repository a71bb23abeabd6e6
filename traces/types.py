"""The records every trace loader returns: one `TraceRequest` per request, grouped in a `Trace`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.traces.stats import TraceInfo


# vLLM's result keys of a ramp-up, saved only when the run had one.
RAMP_UP_KEYS = ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a trace: when it arrives, how long its prompt and output are.

    `hash_ids[i]` names prompt block i (tokens [i*B, (i+1)*B) with B = `hash_block_size`)
    together with everything before it, as in the Mooncake traces: two requests share their
    first k*B prompt tokens exactly when their first k ids are equal. `prompt_token_ids` is set
    only when a tokenizer produced the prompt's tokens. `output_token_ids` is set only for a
    served run's record (the outputs the engine sampled): replayed through the simulator, they
    give its prefix cache the output pages the engine cached. `prompt_text` is the prompt as
    text where the trace has it (ShareGPT): what a benchmark client sends, so that the server
    tokenizes it as it would a user's. `priority` (lower first under priority scheduling, as
    vLLM) and `slo_class` (the class its latencies are reported in) come from the trace's
    `priority` and `slo_class` fields where it has them, or from a workload spec's classes.
    """

    request_id: int  # 0..n-1 in arrival order
    arrival_s: float  # seconds since the first request (the first is 0.0)
    input_len: int  # prompt tokens (>= 1)
    output_len: int  # generated tokens (>= 1)
    hash_ids: tuple[int, ...] | None = None
    hash_block_size: int = 512
    prompt_token_ids: tuple[int, ...] | None = None
    output_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    priority: int = 0
    slo_class: str | None = None


@dataclass(slots=True)
class Trace:
    """A named, ordered list of requests and where it came from.

    `metadata` records what shaped the requests beyond the file itself, so a result can say
    exactly which workload it ran: rows skipped by a loader (`num_failed_skipped` for BurstGPT,
    `num_skipped_entries` for ShareGPT), the token-length source, synthetic options, and the
    arrival options applied (`request_rate`, `burstiness`, `seed`, `time_scale`).
    """

    name: str  # e.g. "azure-conv excerpt", or the file name
    dataset_name: str  # azure | mooncake | burstgpt | sharegpt | random
    source: str  # a path, "bundled:<file>" or "synthetic"
    requests: list[TraceRequest]
    metadata: dict[str, Any] = field(default_factory=dict)

    def prefix_block_size(self) -> int | None:
        """The tokens per block of the hash ids that name every request's prefixes, where
        they all share one (a trace such as Mooncake's); None where a request has token ids
        (its prefixes are hashed page by page), none has hash ids, or block sizes differ."""
        sizes = {r.hash_block_size for r in self.requests if r.hash_ids is not None}
        if len(sizes) != 1 or any(r.prompt_token_ids is not None for r in self.requests):
            return None
        return sizes.pop()

    def __len__(self) -> int:
        return len(self.requests)

    def info(self) -> TraceInfo:
        """Summary statistics: size, duration, rate, length percentiles, prefix-sharing share."""
        from kvlab.traces.stats import trace_info

        return trace_info(self)

    def result_metadata(self) -> dict[str, Any]:
        """The workload's description as saved with a result (the same keys for the simulator
        and the engine)."""
        meta = self.metadata
        return {
            "dataset": self.name,
            "dataset_name": self.dataset_name,
            "dataset_source": self.source,
            "num_prompts": len(self),
            "request_rate": float(meta.get("request_rate", math.inf)),
            "burstiness": float(meta.get("burstiness", 1.0)),
            "time_scale": float(meta.get("time_scale", 1.0)),
            **{key: meta[key] for key in RAMP_UP_KEYS if key in meta},
            **({"slo_classes": meta["slo_classes"]} if "slo_classes" in meta else {}),
        }
