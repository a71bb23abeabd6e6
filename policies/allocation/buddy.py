"""Buddy allocation: power-of-two runs of pages, split on demand, merged with their buddy."""

from __future__ import annotations

import heapq

from kvlab.policies.registry import register


@register(
    "allocation", "buddy", help="power-of-two runs of contiguous pages, split and merged (buddy)"
)
class BuddyAllocator:
    """Free blocks per order (a block of order k is 2^k pages aligned to 2^k).

    Each order keeps a set of free block starts and a heap of them (stale heap entries are skipped),
    so the lowest-address block is always taken first: decisions are deterministic.
    """

    __slots__ = ("_free", "_heaps", "max_order", "num_free_pages", "num_total_pages")
    free_list = None  # a block is an aligned power-of-two run, split from a larger one
    reserves_region = False

    def __init__(self, num_total_pages: int) -> None:
        self.num_total_pages = num_total_pages
        self.num_free_pages = 0
        self.max_order = max(num_total_pages.bit_length() - 1, 0)
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self._heaps: list[list[int]] = [[] for _ in range(self.max_order + 1)]
        start = 0
        for order in range(self.max_order, -1, -1):  # cover [0, N) with aligned power-of-two blocks
            while start + (1 << order) <= num_total_pages and start % (1 << order) == 0:
                self._push(order, start)
                self.num_free_pages += 1 << order
                start += 1 << order

    def pages_for(self, num_pages: int) -> int:
        """The next power of two at or above `num_pages`."""
        return 1 << _order_of(num_pages)

    def allocate(self, num_pages: int) -> list[int] | None:
        """Take the lowest free block of the needed order, splitting a larger one if needed."""
        order = _order_of(num_pages)
        if order > self.max_order:
            return None
        for have in range(order, self.max_order + 1):
            start = self._pop(have)
            if start is None:
                continue
            while have > order:  # split: keep the lower half, free the upper buddy
                have -= 1
                self._push(have, start + (1 << have))
            self.num_free_pages -= 1 << order
            return list(range(start, start + (1 << order)))
        return None

    def can_allocate(self, num_pages: int, extra_free: list[int] = ()) -> bool:  # type: ignore[assignment]
        """Whether a block of the needed order exists, after merging `extra_free` pages in."""
        order = _order_of(num_pages)
        if order > self.max_order:
            return False
        if any(self._free[k] for k in range(order, self.max_order + 1)):
            return True
        if not extra_free:
            return False
        free = [set(s) for s in self._free]
        for page in extra_free:
            _merge_into(free, page, self.max_order, self.num_total_pages)
        return any(free[k] for k in range(order, self.max_order + 1))

    def release(self, pages: list[int]) -> None:
        """Free pages one by one, merging each with its buddy while the buddy is free."""
        for page in pages:
            order, start = _merge_into(self._free, page, self.max_order, self.num_total_pages)
            heapq.heappush(self._heaps[order], start)
            self.num_free_pages += 1

    def num_unusable_free_pages(self) -> int:
        """Free pages outside the largest free block."""
        largest = next((1 << k for k in range(self.max_order, -1, -1) if self._free[k]), 0)
        return self.num_free_pages - largest

    def _push(self, order: int, start: int) -> None:
        self._free[order].add(start)
        heapq.heappush(self._heaps[order], start)

    def _pop(self, order: int) -> int | None:
        heap, free = self._heaps[order], self._free[order]
        while heap:
            start = heapq.heappop(heap)
            if start in free:
                free.remove(start)
                return start
        return None


def _order_of(num_pages: int) -> int:
    return max(num_pages - 1, 0).bit_length()


def _merge_into(free: list[set[int]], page: int, max_order: int, num_total: int) -> tuple[int, int]:
    """Insert a free page into the per-order sets, merging upwards; returns the final block."""
    order, start = 0, page
    while order < max_order:
        buddy = start ^ (1 << order)
        if buddy not in free[order] or buddy + (1 << order) > num_total:
            break
        free[order].remove(buddy)
        start = min(start, buddy)
        order += 1
    free[order].add(start)
    return order, start
