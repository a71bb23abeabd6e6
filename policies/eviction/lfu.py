"""Least-frequently-used eviction of cached prefix pages (ties: least recently used)."""

from __future__ import annotations

from kvlab.policies.eviction.scored import HeapEviction
from kvlab.policies.registry import register


@register("eviction", "lfu", help="prefix caching; evict the cached page with the fewest hits")
class LFUEviction(HeapEviction):
    """Pages keyed by (hits, release order): cold pages go first, then the stalest."""

    __slots__ = ("_clock", "_hits")

    def __init__(self) -> None:
        super().__init__()
        self._hits: dict[int, int] = {}
        self._clock = 0

    def on_hit(self, page_id: int) -> None:
        """Count one more reuse of the page's content."""
        self._hits[page_id] = self._hits.get(page_id, 0) + 1

    def _priority(self, page_id: int, depth: int) -> tuple:
        self._clock += 1
        return (self._hits.get(page_id, 0), self._clock)

    def _forget(self, page_id: int) -> None:
        self._hits.pop(page_id, None)
