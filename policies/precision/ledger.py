"""The bytes demotion frees, as pages the pool may hand out: every page's level and the
ballast that keeps the pool's bytes equal to the device's.

The pool is built with `num_pages + num_extra` page ids, `num_extra` enough for every page to be
at the lowest level. The ledger holds as ballast (taken from the allocator, never in a block
table) all extra pages that the demoted pages' freed bytes do not pay for: with D the bytes
all demoted pages no longer need, in pages of the cache's dtype, the ballast is
`num_extra - floor(D)` pages, so the bytes of held, cached and free pages at their levels never
exceed the device's `num_pages` pages. A demoted page whose content leaves the device becomes
ballast itself where the pool frees it (its bytes at its level are then free: `settle` hands
out what they pay for); where the pool hands it on at once (an eviction for an allocation) it
is a page of the cache's dtype again, and the ballast it owes is taken at the next `settle`
(from the free pages, else by evicting cached ones; a shortfall, where neither is there, is
counted as `max_debt_pages`).
"""

from __future__ import annotations

from kvlab.policies.page_pool import PagePool
from kvlab.policies.precision.ladder import PrecisionLadder


class PrecisionLedger:
    """Each demoted page's level (`levels`; a page not in it is at level 0), the freed bytes
    (`freed_units`, in units of one level-0 row: integers, so they sum exactly) and the
    ballast pages."""

    __slots__ = ("_cached", "_cached_units", "ballast", "demotions", "freed_units", "ladder",
                 "levels", "max_debt_pages", "num_at_level", "num_extra", "pool", "unit")

    def __init__(self, pool: PagePool, ladder: PrecisionLadder, num_pages: int,
                 page_size: int) -> None:
        """`pool` holds `num_pages + extra_pages(...)` page ids; the extra ones become ballast."""
        self.pool = pool
        self.ladder = ladder
        self.unit = ladder.row_bytes[0] * page_size  # one level-0 page, in row-bytes x slots
        self.num_extra = extra_pages(ladder, num_pages)
        self.levels: dict[int, int] = {}
        self.num_at_level = [0] * (ladder.depth + 1)  # demoted pages per level (index 0 unused)
        self.demotions = [0] * (ladder.depth + 1)  # pages demoted into each level, ever
        self.freed_units = 0
        self.max_debt_pages = 0
        self.ballast: list[int] = []
        self._cached: set[int] = set()  # demoted pages that are cached-free
        self._cached_units = 0  # the bytes evicting all of them would not free
        pool.ledger = self
        self.settle()

    @property
    def num_cached_deficit(self) -> int:
        """Pages fewer than its cached-free pages that evicting all of them would give
        (`PagePool.fits` counts this much less as available): a demoted page frees only its
        level's bytes, so evicting them all leaves the ballast `num_extra - floor((D - C) /
        page)` (C: the bytes the cached demoted pages no longer need), and any ballast still
        owed is short too. Exact, not rounded up: a request that needs every device page
        must fit once everything cached is evicted (a margin here kept one from ever fitting
        and the scheduler preempting it for ever)."""
        owed = self.num_extra - len(self.ballast)
        if not self._cached_units and owed * self.unit <= self.freed_units:
            return 0
        return max(0, owed - (self.freed_units - self._cached_units) // self.unit)

    def cache(self, pages: list[int]) -> None:
        """`pages` became cached-free (the pool calls this)."""
        levels = self.levels
        if not levels:
            return
        row, size = self.ladder.row_bytes, self.unit // self.ladder.row_bytes[0]
        for page in pages:
            level = levels.get(page, 0)
            if level and page not in self._cached:
                self._cached.add(page)
                self._cached_units += (row[0] - row[level]) * size

    def hit(self, pages: list[int]) -> None:
        """`pages` were taken as prefix hits: none is cached-free now (the pool calls this)."""
        if self._cached:
            for page in pages:
                self._uncache(page)

    def _uncache(self, page: int) -> None:
        if page in self._cached:
            self._cached.remove(page)
            row = self.ladder.row_bytes
            self._cached_units -= (row[0] - row[self.levels[page]]) * (self.unit // row[0])

    def level(self, page: int) -> int:
        """The page's precision level (0: the cache's dtype)."""
        return self.levels.get(page, 0)

    def demote(self, page: int, level: int, page_size: int) -> int:
        """Record `page` requantized down to `level` (below its current one); returns its
        level before."""
        before = self.levels.get(page, 0)
        assert level > before, (page, before, level)
        row = self.ladder.row_bytes
        self.freed_units += (row[before] - row[level]) * page_size
        if page in self._cached:
            self._cached_units += (row[before] - row[level]) * page_size
        self.levels[page] = level
        if before:
            self.num_at_level[before] -= 1
        self.num_at_level[level] += 1
        self.demotions[level] += 1
        return before

    def drop(self, pages: list[int], reuse: bool) -> list[int]:
        """The content of `pages` left the device (freed or evicted): returns those the pool
        may free or reuse (the pool calls this). A demoted page's id joins the ballast where
        the caller frees it (its bytes at its level are free now: `settle` hands out what
        they pay for); one the caller reuses at once becomes a page of the cache's dtype, and
        the ballast it owes is taken at once by evicting further cached pages (the caller's
        prefix hits are taken before it takes pages), else owed until `settle`."""
        levels = self.levels
        if not levels:
            return pages
        row, num_at = self.ladder.row_bytes, self.num_at_level
        size = self.unit // row[0]
        out, owed = [], False
        for page in pages:
            level = levels.get(page, 0)
            if not level:
                out.append(page)
                continue
            self._uncache(page)
            del levels[page]
            self.freed_units -= (row[0] - row[level]) * size
            num_at[level] -= 1
            if reuse:
                out.append(page)
                owed = True
            else:
                self.ballast.append(page)
        if owed:
            self.settle()
        return out

    def settle(self) -> None:
        """Hold exactly the ballast the freed bytes leave: release what they pay for, take
        back (free pages first, then evicting cached ones) what they no longer do."""
        ballast, allocator, pool = self.ballast, self.pool.allocator, self.pool
        target = self.num_extra - self.freed_units // self.unit
        if len(ballast) > target:
            give = ballast[target:]
            del ballast[target:]
            allocator.release(give)
            return
        while len(ballast) < target:
            if allocator.num_free_pages:
                ballast.extend(allocator.allocate(1) or ())
            elif len(pool.evictor):
                pool.evict(1)  # (a demoted victim joins the ballast itself: `drop`)
            else:
                self.max_debt_pages = max(self.max_debt_pages, target - len(ballast))
                return
            target = self.num_extra - self.freed_units // self.unit
        if len(ballast) > target:
            self.settle()

    @property
    def num_ballast_pages(self) -> int:
        """Page ids held back because their bytes are not free."""
        return len(self.ballast)


def extra_pages(ladder: PrecisionLadder, num_pages: int) -> int:
    """Page ids beyond the device's `num_pages` that demoting every page to the lowest level
    would pay for."""
    row = ladder.row_bytes
    return num_pages * (row[0] - row[-1]) // row[-1]
