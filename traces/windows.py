"""Consecutive windows of a trace: each a validated excerpt and the calibration excerpt after it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kvlab.errors import KvlabError
from kvlab.traces.types import Trace


def split_windows(
    trace: Trace, num_prompts: int, num_calibration: int, num_windows: int
) -> list[tuple[Trace, Trace]]:
    """`num_windows` consecutive (validated, calibration) pairs: window k validates
    `num_prompts` requests and calibrates on the `num_calibration` after them; the next window
    starts after those. Arrivals are shifted as a whole: a validated excerpt's to start where
    the trace starts, a calibration excerpt's to start at 0."""
    stride = num_prompts + num_calibration
    needed = stride * num_windows
    if len(trace) < needed:
        raise KvlabError(
            f"{trace.name} has {len(trace)} requests; {num_windows} window(s) of "
            f"{num_prompts} validated and {num_calibration} calibration requests need {needed}"
        )
    origin = trace.requests[0].arrival_s if len(trace) else 0.0
    pairs = []
    for index in range(num_windows):
        start = index * stride
        head = trace.requests[start : start + num_prompts]
        tail = trace.requests[start + num_prompts : start + stride]
        number = f" {index + 1}" if num_windows > 1 else ""
        validated = _excerpt(trace, head, f"{trace.name} (window{number})" if number else
                             trace.name, origin)
        calibration = _excerpt(trace, tail, f"{trace.name} (calibration window{number})")
        pairs.append((validated, calibration))
    return pairs


def _excerpt(trace: Trace, requests: Sequence[Any], name: str, origin: float = 0.0) -> Trace:
    """`requests` as a trace of their own, arrivals shifted so the first is at `origin`."""
    shift = (requests[0].arrival_s - origin) if requests else 0.0
    moved = [dataclasses.replace(r, arrival_s=r.arrival_s - shift) for r in requests]
    return dataclasses.replace(trace, name=name, requests=moved)
