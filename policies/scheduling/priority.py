"""Priority scheduling, as vLLM 0.32's `--scheduling-policy priority`.

vLLM's waiting queue under priority is a heap ordered by (priority, arrival time, request id):
a lower value runs first. A preempted request goes back into that order (not to the head), and
the request preempted when memory runs out is the running one with the largest (priority,
arrival time), the first such in the running list on a tie (`Scheduler.schedule` in
vllm/v1/core/sched/scheduler.py; `Request.__lt__` in vllm/v1/request.py). vLLM has no
starvation guard for it; neither has this.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvlab.policies.request import Request
from kvlab.policies.scheduling.base import BaseOrder, register_order, sort_in_place

if TYPE_CHECKING:
    from kvlab.policies.manager import KVCacheManager


def priority_key(request: Request) -> tuple[int, float, int]:
    """vLLM's order of two requests under priority scheduling (smaller first)."""
    return (request.priority, request.arrival_s, request.request_id)


def _victim_key(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_s)


@register_order("priority", help="vLLM's priority scheduling: lowest priority value first "
                "(ties by arrival); the running request with the largest (priority, arrival) "
                "is preempted first")
@dataclass(slots=True, frozen=True)
class PriorityOrder(BaseOrder):
    """Waiting and swapped requests by (priority, arrival, id); victims by vLLM's rule."""

    arranges_swapped: ClassVar[bool] = True
    chooses_victim: ClassVar[bool] = True

    def arrange(self, queue: deque[Request], manager: KVCacheManager, now_s: float) -> None:
        """Sort by (priority, arrival, request id), as vLLM's heap pops them."""
        sort_in_place(queue, priority_key)

    def victim(self, running: list[Request]) -> Request | None:
        """The lowest-priority running request (largest value; ties: the latest arrival, then
        the first in the running list, as vLLM's `max`)."""
        return max(running, key=_victim_key)
