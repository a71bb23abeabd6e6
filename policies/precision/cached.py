"""The cached-free prefix pages that `cached=1` demotes: the next victims of the pool's evictor
still above the lowest level, looked at again only after the pool changed its cached-free
pages."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any

from kvlab.policies.precision.ledger import PrecisionLedger, read_levels

if TYPE_CHECKING:
    from kvlab.policies.page_pool import PagePool

# Cached-free pages looked at per step for demotion (from the eviction end): bounds the work.
_CACHED_SCAN = 256


class CachedVictims:
    """The next `_CACHED_SCAN` cached-free victims of `pool`'s evictor, as the ledger sees
    their levels; remembers when they were last all at the lowest level (the ledger's
    `num_cache_changes` then), so that a step where the pool changed no cached-free page
    looks at none of them."""

    __slots__ = ("_clean_at", "ledger", "pool")

    def __init__(self, ledger: PrecisionLedger, pool: PagePool) -> None:
        self.ledger = ledger
        self.pool = pool
        self._clean_at = -1  # the ledger's `num_cache_changes` when last seen all at the bottom

    def is_clean(self) -> bool:
        """Whether every one of the next victims is at the lowest level."""
        return not self.to_demote()

    def to_demote(self) -> list[int]:
        """The next victims above the lowest level, in eviction order; none are remembered as
        clean from here until the pool next changes its cached-free pages, so a caller
        demotes all it is given (`mark_clean`)."""
        ledger = self.ledger
        if ledger.num_cache_changes == self._clean_at:  # (as they were: most steps)
            return []
        bottom = ledger.ladder.depth
        head = _next_victims(self.pool.evictor)
        found = read_levels(ledger.levels, head)
        if min(found, default=bottom) >= bottom:
            self._clean_at = ledger.num_cache_changes
            return []
        return [page for page, level in zip(head, found, strict=True) if level < bottom]

    def mark_clean(self) -> None:
        """The caller demoted every page `to_demote` gave to the lowest level."""
        self._clean_at = self.ledger.num_cache_changes


def _next_victims(evictor: Any) -> list[int]:
    """The cached-free pages `evictor` would evict next, the first `_CACHED_SCAN` of them: in
    its order where it has `next_victims` (LRU's slices its queue), near it for the heap
    policies (fifo, lfu, cost: `HeapEviction.iter_pages`), else in `pages()` order (ARC and
    SLRU: their first list, then their second, each oldest first)."""
    head = getattr(evictor, "next_victims", None)
    if head is not None:
        return head(_CACHED_SCAN)
    scan = getattr(evictor, "iter_pages", evictor.pages)
    return list(islice(scan(), _CACHED_SCAN))
