"""The page pool: every device page, free or cached or held, and the prefix-cache index.

vLLM's `BlockPool`: the allocation policy owns the free pages, the eviction policy the cached-free
ones (no owner, content still indexed), and the pool counts the owners of pages that two or more
block tables hold. Every KV-cache group draws its pages from this one pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from kvlab.policies.interfaces import Allocator, Eviction, add_cached, pop_victims
from kvlab.policies.kv_events import KVEventLog


class PoolLedger(Protocol):
    """What the pool tells a precision ledger (policies/precision/ledger.py)."""

    @property
    def num_cached_deficit(self) -> int:
        """Pages fewer than the cached-free ones that evicting them all gives."""

    def cache(self, pages: list[int]) -> None:
        """`pages` became cached-free."""

    def hit(self, pages: list[int]) -> None:
        """`pages` were taken as prefix hits (cached-free ones are held again)."""

    def drop(self, pages: list[int], reuse: bool) -> list[int]:
        """`pages` lost their content (`reuse`: handed on at once); those the caller may use."""
        ...


class PagePool:
    """Pages, their owners and the prefix-cache index (`cached`: content key -> page).

    A page is free (the allocator's), cached-free (the evictor's, indexed in `cached`) or held
    by block tables. Owners are counted only for pages shared by two or more tables (`owners`):
    a page in one table is the common case, and leaving it out of every count keeps taking and
    releasing runs of pages free of Python work per page.
    """

    __slots__ = (
        "allocator",
        "cache_epoch",
        "cached",
        "events",
        "evictor",
        "free_list",
        "ledger",
        "num_total_pages",
        "on_evicted",
        "owners",
    )

    def __init__(self, allocator: Allocator, evictor: Eviction, num_pages: int, *,
                 exact_blocks: bool) -> None:
        self.allocator = allocator
        self.evictor = evictor
        self.num_total_pages = num_pages
        # Exact blocks from a free list grow by one page taken straight from it: a fast path.
        self.free_list: deque[int] | None = allocator.free_list if exact_blocks else None
        self.owners: dict[int, int] = {}  # page -> number of block tables holding it (>= 2)
        # content key -> the page holding it. A page at index i of a block table is registered
        # exactly when this maps the table's i-th key to it.
        self.cached: dict = {}
        # Counts keys that left the cache: a lookup from another epoch may name a page that
        # holds other content now.
        self.cache_epoch = 0
        self.events: KVEventLog | None = None  # records every prefix-cache change when set
        # Told of each batch of evicted pages and their keys (memory tiers write them back).
        self.on_evicted: Callable[[list[int], list], None] | None = None
        # The precision ledger (policies/precision/ledger.py) where pages are demoted: told of
        # pages cached, hit and dropped, it keeps back the bytes demotion no longer frees.
        self.ledger: PoolLedger | None = None

    @property
    def num_free_pages(self) -> int:
        """Pages with no owner and no cached content."""
        return self.allocator.num_free_pages

    @property
    def num_cached_free_pages(self) -> int:
        """Pages with no owner that still hold a cached prefix (reclaimable)."""
        return len(self.evictor)

    @property
    def allocates_runs(self) -> bool:
        """Whether blocks are power-of-two runs (buddy allocation): neither pages from a free
        list nor contiguous regions, so a block may not fit where its pages do."""
        allocator = self.allocator
        return allocator.free_list is None and not allocator.reserves_region

    @property
    def num_used_pages(self) -> int:
        """Pages held by at least one block table."""
        return self.num_total_pages - self.allocator.num_free_pages - len(self.evictor)

    # ----------------------------------------------------------------------------- fitting

    def fits(self, num_pages: int, hits: list[int], reserve: int,
             freed: list[int] | None = None) -> bool:
        """Whether `num_pages` (as one block) can be taken with `reserve` pages left, evicting
        cached pages if needed; the `hits` (about to be taken) stop being evictable, and the
        held pages `freed` (given back first) count as free."""
        if num_pages <= 0:
            return True
        allocator, evictor = self.allocator, self.evictor
        take = allocator.pages_for(num_pages)
        available = allocator.num_free_pages + len(evictor) + (len(freed) if freed else 0)
        if self.ledger is not None:  # evicting a demoted page frees less than a page
            available -= self.ledger.num_cached_deficit
        if hits and take + reserve > available - len(hits):  # only then can the hits matter
            available -= sum(1 for page in hits if page in evictor)  # they stop being cached
        if take + reserve > available:
            return False
        if allocator.free_list is not None or allocator.can_allocate(num_pages, freed or []):
            return True
        if not len(evictor):
            return False
        hit_set = set(hits)
        evictable = [page for page in evictor.pages() if page not in hit_set]
        return allocator.can_allocate(num_pages, evictable + (freed or []))

    def fits_as_runs(self, num_pages: int, hits: list[int]) -> bool:
        """Whether `num_pages` pages in runs of any power-of-two size can be taken: any free
        or evictable page will do, but the hits stop being evictable."""
        evictor = self.evictor
        num_hits_cached = sum(1 for page in hits if page in evictor)
        return num_pages <= self.allocator.num_free_pages + len(evictor) - num_hits_cached

    # ----------------------------------------------------------------------------- taking

    def take_block(self, num_pages: int) -> list[int]:
        """Take one block, evicting cached pages as needed (`fits` made sure it fits)."""
        allocator = self.allocator
        free = allocator.free_list
        if free is not None and num_pages > len(free):
            # Paging takes the free list from its head: all of it, then the evicted pages in
            # eviction order (what releasing them to its tail and allocating would give).
            pages = list(free)
            free.clear()
            return pages + self.drop_victims(num_pages - len(pages))
        block = allocator.allocate(num_pages)
        while block is None:  # a run that fits only once cached pages are evicted
            self.evict(1)
            block = allocator.allocate(num_pages)
        return block

    def take_runs(self, num_pages: int) -> list[int]:
        """`num_pages` pages as power-of-two runs, largest first (the binary digits of the
        count), evicting cached pages as needed; a run no free block holds, with nothing left
        to evict, is taken as two halves (`fits_as_runs` made sure the pages exist)."""
        allocator, pages = self.allocator, []
        sizes = [1 << bit for bit in range(num_pages.bit_length()) if num_pages >> bit & 1]
        while sizes:
            size = sizes.pop()  # the largest left; halves pushed below stay in order
            run = allocator.allocate(size)
            while run is None and len(self.evictor):
                self.evict(1)
                run = allocator.allocate(size)
            if run is None:
                assert size > 1, "the plan counted more free pages than there are"
                sizes += [size >> 1, size >> 1]
            else:
                pages += run
        return pages

    def take_one(self) -> int | None:
        """The next free page, or the first eviction victim when none is free (what
        `take_block(1)` gives); None when no page is free or cached. Paged free lists only."""
        free = self.free_list
        assert free is not None
        if free:
            return free.popleft()
        # What evict(1) would release to the empty free list and we would pop right back.
        try:
            page, key = self.evictor.pop_victim()
        except LookupError:  # nothing cached either
            return None
        del self.cached[key]
        self.cache_epoch += 1
        if self.events is not None:
            self.events.removed([key])
        if self.on_evicted is not None:
            self.on_evicted([page], [key])
        if self.ledger is not None:
            self.ledger.drop([page], True)
        return page

    def take_hits(self, hits: list[int]) -> int:
        """Add an owner to each prefix-hit page (a cached-free one leaves the evictor); returns
        how many were held by other tables already."""
        owners, evictor = self.owners, self.evictor
        num_shared = 0
        for page in hits:
            count = owners.get(page)
            if count is not None:
                owners[page] = count + 1
                num_shared += 1
            elif page in evictor:
                evictor.remove(page)
            else:
                owners[page] = 2
                num_shared += 1
            evictor.on_hit(page)
        if self.ledger is not None:
            self.ledger.hit(hits)
        return num_shared

    # ----------------------------------------------------------------------------- giving back

    def drop_owner(self, page: int) -> None:
        """One of the owners of a shared page lets it go (the page stays held)."""
        count = self.owners[page]
        if count > 2:
            self.owners[page] = count - 1
        else:
            del self.owners[page]

    def release(self, to_cache: list[int], keys: list, depths: range | list[int],
                to_free: list[int]) -> None:
        """Pages no table holds any more: `to_cache` (registered, with their keys and depths
        in their tables) to the evictor, in that order, and `to_free` to the allocator."""
        add_cached(self.evictor, to_cache, keys, depths)
        if self.ledger is not None:
            self.ledger.cache(to_cache)
            to_free = self.ledger.drop(to_free, False)
        self.allocator.release(to_free)

    def evict(self, num_pages: int) -> None:
        """Drop the content of `num_pages` cached pages, in eviction order, and free them."""
        self.allocator.release(self.drop_victims(num_pages, reuse=False))

    def drop_victims(self, num_pages: int, *, reuse: bool = True) -> list[int]:
        """Take `num_pages` cached pages from the eviction policy, in its order, and forget their
        content; the caller reuses them (`reuse`) or frees those returned (the precision
        ledger may keep some back)."""
        pages, keys = pop_victims(self.evictor, num_pages)
        # A C loop: about 1.3M evictions in a trace-long run, 55 ns each less than `del` in a
        # Python loop here.
        deque(map(self.cached.pop, keys), maxlen=0)
        self.cache_epoch += 1
        if self.events is not None:
            self.events.removed(keys)
        if self.on_evicted is not None:
            self.on_evicted(pages, keys)
        if self.ledger is not None:
            pages = self.ledger.drop(pages, reuse)
        return pages

    def uncache(self, keys: list, pages: list[int]) -> None:
        """Take out of the index each key still mapped to its page (registered content that
        was never written); recorded as removed."""
        cached, removed = self.cached, []
        for key, page in zip(keys, pages, strict=True):
            if cached.get(key) == page:
                del cached[key]
                removed.append(key)
        if self.events is not None:
            self.events.removed(removed)
        self.cache_epoch += 1
