"""Allocation policies: which free pages a new block takes.

An allocator owns the pages that are truly free (no owner and no cached prefix content) and hands
out blocks of them. Cached prefix pages are held by the eviction policy and are given back to the
allocator one by one when evicted.
"""

from __future__ import annotations

from typing import Protocol

from kvlab.policies.allocation import buddy, contiguous, paged  # noqa: F401  (registers them)


class Allocator(Protocol):
    """The address-space policy behind `KVCacheManager`."""

    num_total_pages: int
    num_free_pages: int

    def pages_for(self, num_pages: int) -> int:
        """How many pages a request for `num_pages` actually receives (buddy rounds up)."""
        ...

    def allocate(self, num_pages: int) -> list[int] | None:
        """Take a block of `pages_for(num_pages)` pages, or None (nothing changed)."""
        ...

    def can_allocate(self, num_pages: int, extra_free: list[int] = ()) -> bool:  # type: ignore[assignment]
        """Whether `allocate(num_pages)` would succeed if `extra_free` pages were released first."""
        ...

    def release(self, pages: list[int]) -> None:
        """Give pages back (any order; runs are merged where the policy merges)."""
        ...

    def num_unusable_free_pages(self) -> int:
        """Free pages outside the largest block it can hand out (external fragmentation)."""
        ...
