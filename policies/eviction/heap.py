"""A priority set of pages on a lazy heap: the shared engine of the scored eviction policies."""

from __future__ import annotations

import heapq


class PageHeap:
    """Pages ordered by a key; removal is lazy (stale heap entries are skipped on pop)."""

    __slots__ = ("_heap", "_key")

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._key: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self._key)

    def push(self, page_id: int, key: tuple) -> None:
        """Add a page with its priority (smallest pops first)."""
        self._key[page_id] = key
        heapq.heappush(self._heap, (*key, page_id))

    def discard(self, page_id: int) -> None:
        """Remove a page if present."""
        self._key.pop(page_id, None)

    def pop(self) -> int:
        """The page with the smallest key. Raises LookupError when empty."""
        while self._heap:
            *key, page_id = heapq.heappop(self._heap)
            if self._key.get(page_id) == tuple(key):
                del self._key[page_id]
                return page_id
        raise LookupError("no cached page to evict")

    def pages(self) -> list[int]:
        """The pages held, in no particular order."""
        return list(self._key)
