"""First-in-first-out eviction: the page cached earliest goes first, however often it was hit."""

from __future__ import annotations

from collections.abc import Hashable

from kvlab.policies.eviction.heap import PageHeap
from kvlab.policies.registry import register


@register("eviction", "fifo", help="prefix caching; evict the page that entered the cache first")
class FIFOEviction:
    """Ordered by when a page's content was first cached (its registration number)."""

    __slots__ = ("_heap", "_next", "_registered")
    caches = True

    def __init__(self) -> None:
        self._heap = PageHeap()
        self._registered: dict[int, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._heap

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key`, became unreferenced; its place is its
        first-cached time."""
        if page_id not in self._registered:
            self._registered[page_id] = self._next
            self._next += 1
        self._heap.push(page_id, (self._registered[page_id],), key)

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back."""
        self._heap.discard(page_id)

    def on_hit(self, page_id: int) -> None:
        """Hits do not change FIFO order."""

    def pop_victim(self) -> tuple[int, Hashable]:
        """The earliest-cached page and its key. Raises LookupError when none is cached."""
        page_id, key = self._heap.pop()
        self._registered.pop(page_id, None)
        return page_id, key

    def pages(self) -> list[int]:
        """Cached-free pages."""
        return self._heap.pages()
