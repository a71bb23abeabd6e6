"""Shortest job first: by prompt length (what a scheduler knows), or by total length (an
oracle bound that knows each request's real output length, as the simulator does)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlab.policies.request import Request
from kvlab.policies.scheduling.base import (
    BaseOrder,
    register_order,
    sort_in_place,
    starving_first,
)

if TYPE_CHECKING:
    from kvlab.policies.manager import KVCacheManager


@dataclass(slots=True, frozen=True)
class _ShortestFirst(BaseOrder):
    """Waiting requests by a length, shortest first (ties by arrival).

    `max_wait_s` is a starvation guard of kvlab's own (BLIS's sjf and SGLang have none): a
    request that has waited longer than it since arrival goes ahead of every shorter one."""

    max_wait_s: float | None = None

    def arrange(self, queue: deque[Request], manager: KVCacheManager, now_s: float) -> None:
        """Sort by the length, behind the starvation guard."""
        sort_in_place(queue, starving_first(self.max_wait_s, now_s, self.length_key))

    def length_key(self, request: Request) -> tuple[int, float, int]:
        """(the length that orders, arrival, request id)."""
        raise NotImplementedError


@register_order("sjf", help="shortest job first by prompt length (ties by arrival); "
                "max_wait_s=S serves requests waiting longer than S first (default: no guard)")
@dataclass(slots=True, frozen=True)
class SJFOrder(_ShortestFirst):
    """Waiting requests by prompt length, shortest first."""

    def length_key(self, request: Request) -> tuple[int, float, int]:
        """(prompt length, arrival, request id)."""
        return (request.prompt_len, request.arrival_s, request.request_id)


@register_order("sjf-oracle", help="shortest job first by total length, prompt + real output "
                "(an oracle bound: the trace's output length); max_wait_s=S as sjf")
@dataclass(slots=True, frozen=True)
class OracleSJFOrder(_ShortestFirst):
    """Waiting requests by prompt plus output length (known to the simulator, not to a real
    server): the bound a length predictor could reach."""

    def length_key(self, request: Request) -> tuple[int, float, int]:
        """(prompt + output length, arrival, request id)."""
        return (request.total_len, request.arrival_s, request.request_id)
