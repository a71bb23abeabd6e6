"""Paged allocation (vLLM-like): any free page serves any block; no external fragmentation."""

from __future__ import annotations

from collections import deque
from itertools import repeat

from kvlab.policies.registry import register


@register(
    "allocation", "paged", help="fixed-size pages from a free list, anywhere in memory (vLLM)"
)
class PagedAllocator:
    """A FIFO free list of page ids: freed pages are reused last, in a deterministic order."""

    __slots__ = ("free_list", "num_total_pages")
    reserves_region = False

    def __init__(self, num_total_pages: int) -> None:
        self.num_total_pages = num_total_pages
        # Public so the manager's hot path can pop a page without a call; only pop from the left.
        self.free_list: deque[int] = deque(range(num_total_pages))

    @property
    def num_free_pages(self) -> int:
        """Truly free pages."""
        return len(self.free_list)

    def pages_for(self, num_pages: int) -> int:
        """Paging hands out exactly what is asked."""
        return num_pages

    def allocate(self, num_pages: int) -> list[int] | None:
        """Pop `num_pages` free pages, or None when fewer are free."""
        free = self.free_list
        if num_pages > len(free):
            return None
        return list(map(deque.popleft, repeat(free, num_pages)))  # the pops in C

    def can_allocate(self, num_pages: int, extra_free: list[int] = ()) -> bool:  # type: ignore[assignment]
        """Enough pages, counting `extra_free` as released."""
        return num_pages <= len(self.free_list) + len(extra_free)

    def release(self, pages: list[int]) -> None:
        """Append pages to the tail of the free list."""
        self.free_list.extend(pages)

    def num_unusable_free_pages(self) -> int:
        """Every free page is usable by paging."""
        return 0
