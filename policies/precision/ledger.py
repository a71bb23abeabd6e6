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

import operator
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate, compress, repeat

import numpy as np

from kvlab.policies.page_pool import PagePool
from kvlab.policies.precision.ladder import PrecisionLadder


class PrecisionLedger:
    """Every page's level (`levels`, indexed by page id; 0: the cache's dtype), the freed
    bytes (`freed_units`, in units of one level-0 row: integers, so they sum exactly) and the
    ballast pages.

    Levels are a bytearray, not a dict of the demoted pages: hundreds of thousands of pages
    are demoted in a trace-long run, and reading a list of them (`read_levels`, one C call)
    or writing one level to many (a numpy view's scatter) costs a fifth of a dict's look-ups
    and inserts."""

    __slots__ = ("_cached", "_cached_units", "_into_ballast", "_view", "ballast", "demotions",
                 "freed_units", "ladder", "levels", "max_debt_pages", "num_at_level",
                 "num_cache_changes", "num_dropped", "num_extra", "pool", "step_pairs", "unit")

    def __init__(self, pool: PagePool, ladder: PrecisionLadder, num_pages: int,
                 page_size: int) -> None:
        """`pool` holds `num_pages + extra_pages(...)` page ids; the extra ones become ballast."""
        self.pool = pool
        self.ladder = ladder
        self.unit = ladder.row_bytes[0] * page_size  # one level-0 page, in row-bytes x slots
        self.num_extra = extra_pages(ladder, num_pages)
        self.levels = bytearray(pool.num_total_pages)  # page id -> level
        self._view = np.frombuffer(self.levels, dtype=np.int8)  # (its scatters)
        self.num_at_level = [0] * (ladder.depth + 1)  # demoted pages per level (index 0 unused)
        self.demotions = [0] * (ladder.depth + 1)  # pages demoted into each level, ever
        self.freed_units = 0
        self.max_debt_pages = 0
        self.num_dropped = 0  # demoted pages whose content left the device, ever
        # The pool's calls that may have changed its cached-free pages (`cache`, `hit`,
        # `drop`), ever: where none came since, the eviction order holds the same pages.
        self.num_cache_changes = 0
        # (level before, level after) -> pages demoted so, since the driver last reset it
        self.step_pairs = {(before, after): 0 for after in range(ladder.depth + 1)
                           for before in range(after)}
        self.ballast: list[int] = []
        self._cached: set[int] = set()  # demoted pages that are cached-free
        self._cached_units = 0  # the bytes evicting all of them would not free
        self._into_ballast = False  # `settle` evicting: every dropped page joins the ballast
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
        self.num_cache_changes += 1
        if not any(self.num_at_level):  # (nothing demoted)
            return
        found = read_levels(self.levels, pages)  # (C loops: a freed prompt's pages)
        if not any(found):
            return
        demoted, cached = list(compress(pages, found)), self._cached
        if not cached.isdisjoint(demoted):  # (some cached already: count the others)
            keep = [page not in cached for page in demoted]
            demoted = list(compress(demoted, keep))
            found = list(compress(filter(None, found), keep))
        cached.update(demoted)
        self._cached_units += self._units_below(found)

    def hit(self, pages: list[int]) -> None:
        """`pages` were taken as prefix hits: none is cached-free now (the pool calls this)."""
        self.num_cache_changes += 1
        self._uncache(pages)

    def _uncache(self, pages: list[int]) -> None:
        """Those of `pages` that are cached-free and demoted are no longer cached-free."""
        cached = self._cached
        if cached and not cached.isdisjoint(pages):
            gone = cached.intersection(pages)
            cached -= gone
            self._cached_units -= self._units_below(read_levels(self.levels, list(gone)))

    def _units_below(self, levels: Sequence[int]) -> int:
        """The bytes pages at `levels` (0 counts nothing) no longer need, in units."""
        row, size = self.ladder.row_bytes, self.unit // self.ladder.row_bytes[0]
        return sum(levels.count(level) * (row[0] - row[level]) * size
                   for level in range(1, len(row)))

    def level(self, page: int) -> int:
        """The page's precision level (0: the cache's dtype)."""
        return self.levels[page]

    def _write(self, pages: Sequence[int], level: int) -> None:
        """Each of `pages` at `level` (a scatter where they are many)."""
        if len(pages) > 16:
            self._view[np.fromiter(pages, np.intp, len(pages))] = level
        else:
            levels = self.levels
            for page in pages:
                levels[page] = level

    def demote_pages(self, pages: list[int], level: int, demoted: list[int],
                     befores: list[int]) -> None:
        """Demote each of `pages` (distinct) not at `level` or lower precision yet, in order;
        appends each page demoted to `demoted` and its level before to `befores`."""
        found = read_levels(self.levels, pages)  # (C loops: whole prompts at once)
        if max(found, default=level) >= level:
            keep = [before < level for before in found]
            pages, found = list(compress(pages, keep)), list(compress(found, keep))
            if not pages:
                return
        self._write(pages, level)
        self._count_demoted(found, level)
        cached = self._cached
        if cached and not cached.isdisjoint(pages):
            row, size = self.ladder.row_bytes, self.unit // self.ladder.row_bytes[0]
            for page, before in zip(pages, found, strict=True):
                if page in cached:
                    self._cached_units += (row[before] - row[level]) * size
        demoted += pages
        befores += found

    def _count_demoted(self, befores: Sequence[int], level: int) -> None:
        """Pages at levels `befores` (each above `level`) were just demoted to `level`: the
        step's (before, after) counts, the bytes freed, the pages per level and the
        demotions into `level`."""
        row, size = self.ladder.row_bytes, self.unit // self.ladder.row_bytes[0]
        num_at, pairs = self.num_at_level, self.step_pairs
        for before in range(level):
            count = befores.count(before)
            if count:
                pairs[before, level] += count
                self.freed_units += count * (row[before] - row[level]) * size
                if before:
                    num_at[before] -= count
        num_at[level] += len(befores)
        self.demotions[level] += len(befores)

    def demote_walk(self, span: list[int], cut1: int, cut2: int, demoted: list[int],
                    befores: list[int], afters: list[int]) -> int:
        """One sequence's held pages `span` walked in one step to level 1 from `cut1` on and
        to level 2 before `cut2` (0 <= cut1 < cut2 <= len(span)): the levels, bytes and counts
        of `demote_pages` at level 1 then at level 2, each page looked up and written once.
        Appends each page demoted once, in the order of its first demotion, with its level
        before and after (the two calls' lists as `end_step` deduplicates them). Returns the
        demotions (a page demoted to both levels counts two)."""
        row = self.ladder.row_bytes
        found = read_levels(self.levels, span)  # (C loops: whole prompts at once)
        if not any(found):  # (the usual backlog: nothing demoted yet)
            first1, firsts2, befores2 = span[cut1:], span[:cut1], [0] * cut1
            to_two, to_one = span[:cut2], span[cut2:]
            num_20, num_21 = cut2, 0
        else:  # (C loops: a prefix hit's pages, or pages walked before, may be demoted)
            head, mid, tail = found[:cut1], found[cut1:cut2], found[cut2:]
            first1 = span[cut1:] if not any(mid) and not any(tail) else \
                list(compress(span[cut1:], map(operator.not_, found[cut1:])))
            # level 2 first: the pages below cut1 not at 2 yet, those above it at level 1
            if 2 in head:
                firsts2 = list(compress(span[:cut1], map((2).__gt__, head)))
                befores2 = list(filter((2).__gt__, head))
            else:
                firsts2, befores2 = span[:cut1], list(head)
            if 1 in mid:
                ones = list(compress(span[cut1:cut2], map((1).__eq__, mid)))
                firsts2 += ones
                befores2 += repeat(1, len(ones))
            low = found[:cut2]
            to_two = span[:cut2] if 2 not in low else \
                list(compress(span[:cut2], map((2).__gt__, low)))
            to_one = span[cut2:] if not any(tail) else \
                list(compress(span[cut2:], map(operator.not_, tail)))
            num_20, num_21 = low.count(0), low.count(1)
        self._write(to_two, 2)
        self._write(to_one, 1)
        size, num_at = self.unit // row[0], self.num_at_level
        self.freed_units += (num_20 * (row[0] - row[2]) + num_21 * (row[1] - row[2])
                             + len(to_one) * (row[0] - row[1])) * size
        num_at[1] += len(to_one) - num_21
        num_at[2] += len(to_two)
        self.demotions[1] += len(first1)
        self.demotions[2] += len(to_two)
        demoted += first1
        demoted += firsts2
        befores += repeat(0, len(first1))
        befores += befores2
        pairs, num_2_from_0 = self.step_pairs, befores2.count(0)
        pairs[0, 1] += len(to_one)
        pairs[0, 2] += len(first1) - len(to_one) + num_2_from_0
        pairs[1, 2] += len(firsts2) - num_2_from_0
        # first1's pages below cut2 went on to level 2
        afters += repeat(2, len(first1) - len(to_one))
        afters += repeat(1, len(to_one))
        afters += repeat(2, len(firsts2))
        return len(first1) + len(to_two)

    def demote_each(self, pages: list[int], targets: list[int], demoted: list[int],
                    befores: list[int], afters: list[int]) -> int:
        """Each of `pages` (distinct, all in block tables) not at its level in `targets` or
        lower precision yet demoted to it, in order: what `demote_pages` gives walk by walk,
        in one call for a step's many short walks. Appends each page demoted, its level before
        and after; returns how many."""
        found = read_levels(self.levels, pages)
        keep = list(map(operator.lt, found, targets))
        if all(keep):
            found = list(found)
        else:
            pages, found = list(compress(pages, keep)), list(compress(found, keep))
            targets = list(compress(targets, keep))
            if not pages:
                return 0
        for level in set(targets):
            if len(targets) == targets.count(level):
                at, of_level = pages, found
            else:
                at = list(compress(pages, map(level.__eq__, targets)))
                of_level = list(compress(found, map(level.__eq__, targets)))
            self._write(at, level)
            self._count_demoted(of_level, level)
        demoted += pages
        befores += found
        afters += targets
        return len(pages)

    def drop(self, pages: list[int], reuse: bool) -> list[int]:
        """The content of `pages` left the device (freed or evicted): returns those the pool
        may free or reuse (the pool calls this). A demoted page's id joins the ballast where
        the caller frees it (its bytes at its level are free now: `settle` hands out what
        they pay for); one the caller reuses at once becomes a page of the cache's dtype, and
        the ballast it owes is taken at once by evicting further cached pages (the caller's
        prefix hits are taken before it takes pages), else owed until `settle`."""
        self.num_cache_changes += 1
        into_ballast = self._into_ballast and not reuse
        found = read_levels(self.levels, pages) if any(self.num_at_level) else None
        if not found or not any(found):
            if into_ballast:
                self.ballast += pages
                return []
            return pages
        demoted = list(compress(pages, found))
        self.num_dropped += len(demoted)
        demoted_levels = list(filter(None, found))
        below = self._units_below(demoted_levels)
        cached = self._cached
        if cached and not cached.isdisjoint(demoted):
            gone = cached.intersection(demoted)
            if len(gone) == len(demoted):  # (evicted: every one cached-free)
                cached -= gone
                self._cached_units -= below
            else:
                self._uncache(demoted)
        self._write(demoted, 0)
        self.freed_units -= below
        for level in range(1, len(self.num_at_level)):
            self.num_at_level[level] -= demoted_levels.count(level)
        if reuse:
            self.settle()
            return pages
        if into_ballast:
            self.ballast += pages
            return []
        self.ballast += demoted
        return list(compress(pages, map(operator.not_, found)))

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
            # Each page taken adds one to the ballast and lowers no target, so the first
            # `short` pages are the ones a page-by-page loop takes too, in the same order.
            short = target - len(ballast)
            if allocator.num_free_pages:
                ballast.extend(allocator.allocate(min(short, allocator.num_free_pages)) or ())
            elif len(pool.evictor):
                self._evict_into_ballast(short)
            else:
                self.max_debt_pages = max(self.max_debt_pages, target - len(ballast))
                return
            target = self.num_extra - self.freed_units // self.unit
        if len(ballast) > target:
            self.settle()

    def _num_to_evict(self, short: int) -> int:
        """How many of the next cached pages `settle`'s loop evicts, one at a time, before the
        ballast pays what it owes (`short` pages now; evicting a demoted page adds what its
        level no longer frees): read ahead in the eviction order where the policy offers it
        (LRU's `next_victims`), else `short`, and `settle` goes on."""
        evictor = self.pool.evictor
        peek = getattr(evictor, "next_victims", None)
        if peek is None:
            return min(short, len(evictor))
        row, size, levels = self.ladder.row_bytes, self.unit // self.ladder.row_bytes[0], \
            self.levels
        owed, freed, unit = self.num_extra - len(self.ballast), self.freed_units, self.unit
        pages = peek(min(len(evictor), 4 * short + 16))
        # The loop's test after t pages, t >= owed - (freed - bytes_t) // unit (bytes_t: what
        # the first t no longer need), only turns true as t grows (each page's bytes are under
        # a unit): a bisection over the running sums (C loops) finds the first t it holds at.
        below = [(row[0] - level_row) * size for level_row in row]
        spared = list(accumulate(map(below.__getitem__, read_levels(levels, pages))))
        first = bisect_left(range(len(spared)), True,
                            key=lambda k: k + 1 >= owed - (freed - spared[k]) // unit)
        return first + 1 if first < len(spared) else max(len(spared), 1)

    def _evict_into_ballast(self, short: int) -> None:
        """Evict cached pages into the ballast, `short` pages short of it, in eviction order,
        as `settle`'s loop would one at a time (`_num_to_evict`): a demoted one joins it
        itself (`drop`), another is freed and taken back at once (the free list is empty
        here). All at once where no one else watches the evictions (memory tiers, KV events);
        else one, and `settle` goes on."""
        pool = self.pool
        if short <= 1 or pool.on_evicted is not None or pool.events is not None:
            pool.evict(1)  # (a page freed is taken by `settle`'s next turn)
            return
        num_pages = self._num_to_evict(short)
        self._into_ballast = True
        try:
            pool.evict(num_pages)
        finally:
            self._into_ballast = False

    @property
    def num_spared_pages(self) -> int:
        """Whole pages at the cache's dtype that the held demoted pages no longer need: the
        bytes freed less the cached-free demoted pages' (held page ids less this many are the
        device pages' worth of bytes held, rounded up)."""
        return (self.freed_units - self._cached_units) // self.unit

    @property
    def num_ballast_pages(self) -> int:
        """Page ids held back because their bytes are not free."""
        return len(self.ballast)


class DemotedPages:
    """The pages a ledger's `levels` has demoted, as `in` asks a set (a prefix lookup's
    `stop_at` with `recompute=1`)."""

    __slots__ = ("levels",)

    def __init__(self, levels: bytearray) -> None:
        self.levels = levels

    def __contains__(self, page: int) -> bool:
        return bool(self.levels[page])


def read_levels(levels: bytearray, pages: Sequence[int]) -> Sequence[int]:
    """Each of `pages`' level in `levels` (a ledger's), in order (C loops)."""
    if len(pages) > 1:
        return operator.itemgetter(*pages)(levels)
    return [levels[pages[0]]] if pages else []


def extra_pages(ladder: PrecisionLadder, num_pages: int) -> int:
    """Page ids beyond the device's `num_pages` that demoting every page to the lowest level
    would pay for."""
    row = ladder.row_bytes
    return num_pages * (row[0] - row[-1]) // row[-1]
