"""First come, first served: vLLM's and SGLang's default order."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvlab.policies.request import Request
from kvlab.policies.scheduling.base import BaseOrder, register_order

if TYPE_CHECKING:
    from kvlab.policies.manager import KVCacheManager


@register_order("fcfs", help="first come, first served (vLLM's default): arrival order; a "
                "preempted request goes back to the head of the queue")
@dataclass(slots=True, frozen=True)
class FCFSOrder(BaseOrder):
    """Arrival order: the scheduler's queues as they are (nothing is ever rearranged)."""

    reorders: ClassVar[bool] = False

    def arrange(self, queue: deque[Request], manager: KVCacheManager, now_s: float) -> None:
        """Nothing to do: the queue is in arrival order already."""
