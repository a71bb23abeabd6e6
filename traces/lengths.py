"""Shrinking a trace's lengths: the same traffic and prefix sharing on a smaller machine."""

from __future__ import annotations

import dataclasses

from kvlab.errors import KvlabError
from kvlab.traces.types import Trace


def scale_lengths(trace: Trace, length_scale: int) -> Trace:
    """The trace with every prompt and output length divided by `length_scale` (rounded up,
    at least 1) and its hash block size too, so that requests share exactly the blocks they
    shared before (Mooncake's 512-token blocks at 16: 32-token blocks). Prompts with token
    ids cannot shrink, and prompt texts are dropped (a client then sends token ids of the
    scaled lengths); 1 returns the trace unchanged."""
    if isinstance(length_scale, bool) or not isinstance(length_scale, int) or length_scale < 1:
        raise KvlabError(f"length_scale {length_scale!r}: expected a whole number >= 1",
                         parameters=("length_scale",))
    if length_scale == 1:
        return trace
    requests = []
    for r in trace.requests:
        if r.prompt_token_ids is not None:
            raise KvlabError(f"length_scale {length_scale}: request {r.request_id} has prompt "
                             "token ids, which cannot be shortened", parameters=("length_scale",))
        block = r.hash_block_size
        if r.hash_ids is not None and block % length_scale:
            raise KvlabError(f"length_scale {length_scale}: expected a divisor of the trace's "
                             f"hash block size {block}", parameters=("length_scale",))
        requests.append(dataclasses.replace(
            r, input_len=-(-r.input_len // length_scale),
            output_len=-(-r.output_len // length_scale), prompt_text=None,
            hash_block_size=block // length_scale if r.hash_ids is not None else block))
    metadata = {**trace.metadata, "length_scale": length_scale}
    return Trace(trace.name, trace.dataset_name, trace.source, requests, metadata)
