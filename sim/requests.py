"""Trace requests turned into the scheduler's `Request`s (fresh ones for every run)."""

from __future__ import annotations

from kvlab.policies import Request
from kvlab.traces import Trace


def to_requests(trace: Trace) -> list[Request]:
    """One new `Request` per trace request: its lengths, arrival and prompt identity.

    The trace's output length becomes the output budget, which the simulator always reaches
    (it samples no end-of-sequence token). Recorded output ids (a served run's) are the
    request's outputs from the start, so its output pages are cached as the engine cached them.
    """
    return [
        Request(
            request_id=r.request_id,
            prompt_len=r.input_len,
            max_output_tokens=r.output_len,
            arrival_s=r.arrival_s,
            prompt_token_ids=None if r.prompt_token_ids is None else list(r.prompt_token_ids),
            hash_ids=r.hash_ids,
            hash_block_size=r.hash_block_size,
            output_token_ids=[] if r.output_token_ids is None else list(r.output_token_ids),
            output_ids_known=r.output_token_ids is not None and r.prompt_token_ids is not None,
            priority=r.priority,
            slo_class=r.slo_class,
        )
        for r in trace.requests
    ]
