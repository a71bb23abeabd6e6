"""Victim choice: which running request is preempted when memory runs out."""

from __future__ import annotations

from collections.abc import Callable

from kvlab.policies.registry import register
from kvlab.policies.request import Request


@register("victim", "last-arrived",
          help="preempt the latest-arriving running request (vLLM V0, FCFS)")
def last_arrived(candidates: list[Request], pages_held: Callable[[Request], int]) -> Request:
    """The request that arrived last (ties: the larger request id)."""
    return max(candidates, key=lambda r: (r.arrival_s, r.request_id))


@register("victim", "last-admitted",
          help="preempt the running request admitted last (vLLM V1: the end of its running list)")
def last_admitted(candidates: list[Request], pages_held: Callable[[Request], int]) -> Request:
    """The last of the running list, which admissions and swap-ins append to: a request
    preempted and readmitted goes to its end, ahead of those that arrived after it."""
    return candidates[-1]


@register("victim", "longest", help="preempt the running request holding the most tokens")
def longest(candidates: list[Request], pages_held: Callable[[Request], int]) -> Request:
    """The request with the most tokens; ties go to the latest arrival."""
    return max(candidates, key=lambda r: (r.num_tokens, r.arrival_s, r.request_id))


@register("victim", "fewest-pages", help="preempt the running request holding the fewest pages")
def fewest_pages(candidates: list[Request], pages_held: Callable[[Request], int]) -> Request:
    """The request that frees the least memory (cheapest to redo); ties go to the latest arrival."""
    return min(candidates, key=lambda r: (pages_held(r), -r.arrival_s, -r.request_id))
