"""First-in-first-out eviction: the page cached earliest goes first, however often it was hit."""

from __future__ import annotations

from kvlab.policies.eviction.scored import HeapEviction
from kvlab.policies.registry import register


@register("eviction", "fifo", help="prefix caching; evict the page that entered the cache first")
class FIFOEviction(HeapEviction):
    """Ordered by when a page's content was first cached (its registration number)."""

    __slots__ = ("_next", "_registered")

    def __init__(self) -> None:
        super().__init__()
        self._registered: dict[int, int] = {}
        self._next = 0

    def _priority(self, page_id: int, depth: int) -> tuple:
        if page_id not in self._registered:
            self._registered[page_id] = self._next
            self._next += 1
        return (self._registered[page_id],)

    def _forget(self, page_id: int) -> None:
        self._registered.pop(page_id, None)
