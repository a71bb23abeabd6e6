"""Small hand-made traces and configs for the simulator tests."""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig
from kvlab.traces import Trace, TraceRequest


def make_trace(
    lengths: Sequence[tuple[int, int]],
    arrivals_s: Sequence[float] | None = None,
    *,
    hash_ids: Sequence[tuple[int, ...] | None] | None = None,
    hash_block_size: int = 16,
) -> Trace:
    """A trace of (input_len, output_len) requests, arriving at arrivals_s (default all at 0)."""
    arrivals = list(arrivals_s) if arrivals_s is not None else [0.0] * len(lengths)
    ids = list(hash_ids) if hash_ids is not None else [None] * len(lengths)
    requests = [
        TraceRequest(
            request_id=i,
            arrival_s=arrival,
            input_len=input_len,
            output_len=output_len,
            hash_ids=ids[i],
            hash_block_size=hash_block_size,
        )
        for i, ((input_len, output_len), arrival) in enumerate(zip(lengths, arrivals, strict=True))
    ]
    return Trace("hand-made", "random", "synthetic", requests)


def small_config(policy: str = "paged", *, num_pages: int = 64, **options: object) -> SimConfig:
    """Llama-2-7B on an A100 with a deliberately small KV cache, so memory runs out."""
    serving = ServingConfig.create(policy, num_gpu_blocks_override=num_pages, **options)
    return SimConfig(serving=serving)
