"""A priority set of pages on a lazy heap: the shared engine of the scored eviction policies."""

from __future__ import annotations

import heapq
from collections.abc import Hashable


class PageHeap:
    """Pages ordered by a priority, each with its prefix hash; removal is lazy (stale heap
    entries are skipped on pop)."""

    __slots__ = ("_heap", "_key", "_prefix")

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._key: dict[int, tuple] = {}
        self._prefix: dict[int, Hashable] = {}  # page -> the prefix hash it holds

    def __len__(self) -> int:
        return len(self._key)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._key

    def push(self, page_id: int, key: tuple, prefix: Hashable) -> None:
        """Add a page holding the prefix hash `prefix`, with its priority `key` (smallest pops
        first)."""
        self._key[page_id] = key
        self._prefix[page_id] = prefix
        heapq.heappush(self._heap, (*key, page_id))

    def discard(self, page_id: int) -> None:
        """Remove a page if present."""
        if self._key.pop(page_id, None) is not None:
            del self._prefix[page_id]

    def pop(self) -> tuple[int, Hashable]:
        """The page with the smallest key, and its prefix hash. Raises LookupError when empty."""
        while self._heap:
            *key, page_id = heapq.heappop(self._heap)
            if self._key.get(page_id) == tuple(key):
                del self._key[page_id]
                return page_id, self._prefix.pop(page_id)
        raise LookupError("no cached page to evict")

    def pages(self) -> list[int]:
        """The pages held, in no particular order."""
        return list(self._key)
