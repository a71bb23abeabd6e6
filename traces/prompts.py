"""Prompt token ids for a trace that has only lengths: deterministic from a seed, and shared
exactly where the trace says prompts share blocks (Mooncake hash ids), so that a server's or the
engine's prefix cache sees the sharing the trace describes. Torch-free (numpy)."""

from __future__ import annotations

import dataclasses

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.types import Trace, TraceRequest

_U64 = (1 << 64) - 1
_SHARED, _PRIVATE = 0, 1  # RNG stream tags: a trace block id, or one request's own prompt


def _block_ids(hash_id: int, size: int, vocab_size: int, seed: int) -> list[int]:
    rng = np.random.default_rng([seed & _U64, _SHARED, hash_id & _U64])
    return rng.integers(0, vocab_size, size).tolist()


def _private_ids(request_id: int, size: int, vocab_size: int, seed: int) -> list[int]:
    rng = np.random.default_rng([seed & _U64, _PRIVATE, request_id & _U64])
    return rng.integers(0, vocab_size, size).tolist()


def synthesize_prompt_ids(trace: Trace, vocab_size: int, seed: int = 0) -> Trace:
    """The trace with every request's `prompt_token_ids` set, deterministic from `seed`.

    Where the trace names prompt blocks by hash id (Mooncake), block i of a prompt is drawn from
    an RNG seeded with (seed, hash_ids[i]), so two requests sharing an id share those tokens
    exactly and the prefix cache sees the trace's sharing; other prompts (or the tail past the
    named blocks) come from an RNG seeded with (seed, request id) and share nothing. Ids lie in
    [0, vocab_size). Token ids a trace already carries are kept, after a vocabulary check. Run
    the simulator on the returned trace to hash exactly the pages the engine hashes.
    """
    blocks: dict[int, list[int]] = {}
    requests = []
    for request in trace.requests:
        if request.prompt_token_ids is not None:
            _check_vocab(request, vocab_size)
            requests.append(request)
            continue
        ids: list[int] = []
        block_size = request.hash_block_size
        for hash_id in request.hash_ids or ():
            if len(ids) >= request.input_len:
                break
            block = blocks.get(hash_id)
            if block is None:
                block = blocks[hash_id] = _block_ids(hash_id, block_size, vocab_size, seed)
            ids.extend(block[: request.input_len - len(ids)])
        if len(ids) < request.input_len:
            ids.extend(
                _private_ids(request.request_id, request.input_len - len(ids), vocab_size, seed)
            )
        requests.append(dataclasses.replace(request, prompt_token_ids=tuple(ids)))
    metadata = {**trace.metadata, "prompt_token_ids": f"synthesized (seed {seed})"}
    return dataclasses.replace(trace, requests=requests, metadata=metadata)


def _check_vocab(request: TraceRequest, vocab_size: int) -> None:
    ids = request.prompt_token_ids or ()
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise KvlabError(
            f"trace request {request.request_id}: prompt token id {bad[0]} is outside the "
            f"model's vocabulary [0, {vocab_size}) (tokenized for another model?)"
        )
