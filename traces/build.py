"""Turns parsed columns into a `Trace`: stable sort by arrival, first N, ids and labels."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.errors import KvlabError, KvlabWarning
from kvlab.traces.bundled import bundled_name_of
from kvlab.traces.types import Trace, TraceRequest


def check_num_prompts(num_prompts: int | None) -> None:
    """Raise a KvlabError unless num_prompts is None or a whole number >= 1."""
    if num_prompts is None:
        return
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, (int, np.integer)) \
            or num_prompts < 1:
        raise KvlabError(
            f"num_prompts {num_prompts!r}: expected a whole number >= 1",
            parameters=("num_prompts",),
        )


def trace_labels(path: Path) -> tuple[str, str]:
    """(name, source) of a trace file: 'azure-conv excerpt' / 'bundled:<file>' for excerpts."""
    bundled = bundled_name_of(path)
    if bundled is not None:
        return f"{bundled} excerpt", f"bundled:{path.name}"
    return path.name, str(path)


def build_trace(
    path: Path,
    dataset_name: str,
    arrival_s: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    *,
    num_prompts: int | None = None,
    hash_ids: Sequence[tuple[int, ...]] | None = None,
    hash_block_size: int = 512,
    prompt_token_ids: Sequence[tuple[int, ...]] | None = None,
    prompt_texts: Sequence[str] | None = None,
    labels: RequestLabels | None = None,
    metadata: dict[str, Any] | None = None,
) -> Trace:
    """A trace of a file's rows in arrival order (stable for ties), keeping the first num_prompts.

    Arrivals are shifted so the first request arrives at 0.0. `labels`: each row's priority and
    SLO class, where the file has them.
    """
    check_num_prompts(num_prompts)
    order = np.argsort(arrival_s, kind="stable")
    metadata = dict(metadata or {})
    if num_prompts is not None:
        if num_prompts > len(order):
            warnings.warn(f"{path}: num_prompts {num_prompts} but the trace holds only "
                          f"{len(order)} requests; using all of them", KvlabWarning,
                          stacklevel=3)
        order = order[:num_prompts]
    name, source = trace_labels(path)
    requests = make_requests(
        arrival_s[order] - arrival_s[order[0]],
        input_len[order],
        output_len[order],
        hash_ids=None if hash_ids is None else [hash_ids[i] for i in order.tolist()],
        hash_block_size=hash_block_size,
        prompt_token_ids=None if prompt_token_ids is None
        else [prompt_token_ids[i] for i in order.tolist()],
        prompt_texts=None if prompt_texts is None else [prompt_texts[i] for i in order.tolist()],
        labels=None if labels is None else labels.pick(order.tolist()),
    )
    return Trace(name, dataset_name, source, requests, metadata)


def make_requests(
    arrival_s: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    *,
    hash_ids: Sequence[tuple[int, ...]] | None = None,
    hash_block_size: int = 512,
    prompt_token_ids: Sequence[tuple[int, ...] | None] | None = None,
    prompt_texts: Sequence[str | None] | None = None,
    labels: RequestLabels | None = None,
) -> list[TraceRequest]:
    """TraceRequests numbered 0..n-1 from parallel arrays already in arrival order."""
    num = len(arrival_s)
    hashes = hash_ids if hash_ids is not None else [None] * num
    token_ids = prompt_token_ids if prompt_token_ids is not None else [None] * num
    texts = prompt_texts if prompt_texts is not None else [None] * num
    requests = [
        TraceRequest(i, t, x, y, h, hash_block_size, p, prompt_text=text)
        for i, (t, x, y, h, p, text) in enumerate(zip(
            arrival_s.astype(float).tolist(), input_len.tolist(), output_len.tolist(),
            hashes, token_ids, texts, strict=True))
    ]
    if labels is None:
        return requests
    return [dataclasses.replace(r, priority=p, slo_class=c) for r, p, c in
            zip(requests, labels.priorities, labels.slo_classes, strict=True)]


@dataclass(slots=True, frozen=True)
class RequestLabels:
    """Each request's priority and SLO class (None: no class), parallel to a trace's rows."""

    priorities: list[int]
    slo_classes: list[str | None]

    def pick(self, rows: list[int]) -> RequestLabels:
        """The labels of `rows`, in that order."""
        return RequestLabels([self.priorities[i] for i in rows],
                             [self.slo_classes[i] for i in rows])


def num_hash_blocks(input_len: int, block_size: int) -> int:
    """How many hash ids a prompt of input_len tokens carries: ceil(input_len / block_size)."""
    return math.ceil(input_len / block_size)
