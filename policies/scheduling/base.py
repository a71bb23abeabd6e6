"""What a scheduling order is: the protocol the scheduler calls, and its registry decorator."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from kvlab.policies.registry import register
from kvlab.policies.request import Request

if TYPE_CHECKING:
    from kvlab.policies.manager import KVCacheManager


class SchedulingOrder(Protocol):
    """How one scheduling policy orders requests.

    `reorders` is False only for first-come-first-served: the scheduler then never calls
    `arrange`, and keeps its queues exactly as requests arrive and are preempted.
    `arrange` puts the waiting queue in admission order, in place, at the start of a step's
    admissions (requests in it are never added or dropped). `arranges_swapped` says whether the
    swapped queue is arranged too. With `chooses_victim`, `victim` picks the running request
    to preempt first in place of the memory policy's `victim`; without, it returns None.
    """

    reorders: ClassVar[bool]
    arranges_swapped: ClassVar[bool]
    chooses_victim: ClassVar[bool]

    def arrange(self, queue: deque[Request], manager: KVCacheManager, now_s: float) -> None:
        """Put `queue` in admission order, in place."""
        ...

    def victim(self, running: list[Request]) -> Request | None:
        """The running request to preempt first, or None for the memory policy's choice."""
        ...


class BaseOrder:
    """The defaults an order inherits: it rearranges the waiting queue only, and leaves the
    victim to the memory policy."""

    __slots__ = ()
    reorders: ClassVar[bool] = True
    arranges_swapped: ClassVar[bool] = False
    chooses_victim: ClassVar[bool] = False

    def victim(self, running: list[Request]) -> Request | None:
        """None: the memory policy's `victim` chooses."""
        return None


def register_order(name: str, *, help: str) -> Callable[[Any], Any]:
    """Class decorator: register a scheduling order under `name` (family "scheduling")."""
    return register("scheduling", name, help=help)


def sort_in_place(queue: deque[Request], key: Callable[[Request], Any]) -> None:
    """Sort a deque of requests by `key`, stably, keeping the same deque object."""
    ordered = sorted(queue, key=key)
    queue.clear()
    queue.extend(ordered)


def starving_first(max_wait_s: float | None, now_s: float,
                   key: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """`key`, behind a starvation guard: with `max_wait_s` set, requests that have waited
    longer than it since arrival come first, in arrival order; the rest follow by `key`."""
    if max_wait_s is None:
        return key
    deadline = now_s - max_wait_s

    def guarded(request: Request) -> Any:
        if request.arrival_s < deadline:
            return (0, request.arrival_s, request.request_id)
        return (1, key(request))

    return guarded
