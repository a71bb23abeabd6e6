"""Least-frequently-used eviction of cached prefix pages (ties: least recently used)."""

from __future__ import annotations

from collections.abc import Hashable

from kvlab.policies.eviction.heap import PageHeap
from kvlab.policies.registry import register


@register("eviction", "lfu", help="prefix caching; evict the cached page with the fewest hits")
class LFUEviction:
    """Pages keyed by (hits, release order): cold pages go first, then the stalest."""

    __slots__ = ("_clock", "_heap", "_hits")
    caches = True

    def __init__(self) -> None:
        self._heap = PageHeap()
        self._hits: dict[int, int] = {}
        self._clock = 0

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._heap

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key`, became unreferenced."""
        self._clock += 1
        self._heap.push(page_id, (self._hits.get(page_id, 0), self._clock), key)

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back."""
        self._heap.discard(page_id)

    def on_hit(self, page_id: int) -> None:
        """Count one more reuse of the page's content."""
        self._hits[page_id] = self._hits.get(page_id, 0) + 1

    def pop_victim(self) -> tuple[int, Hashable]:
        """The least-hit, then least recently used page, and its key. Raises LookupError when
        none is cached."""
        page_id, key = self._heap.pop()
        self._hits.pop(page_id, None)
        return page_id, key

    def pages(self) -> list[int]:
        """Cached-free pages."""
        return self._heap.pages()
