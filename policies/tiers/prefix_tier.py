"""A tier at run time (`PrefixTier`: its store, counters and the pages a step's loads pin) and
the tiers of an instance built from a `TiersConfig`."""

from __future__ import annotations

from collections.abc import Hashable
from itertools import compress

from kvlab.policies.tiers.spec import TiersConfig, TierSpec
from kvlab.policies.tiers.stats import TierStats
from kvlab.policies.tiers.store import TierStore


class PrefixTier:
    """A tier's pages at run time (a `TierStore`), its counters, and the pages pinned by a
    load of the step being decided (not evictable until `unpin_all`). A remote pool is one
    PrefixTier shared by the managers of a cluster.

    A tier page holds `block_pages` device pages (`TiersConfig.block_size`; tier page p is
    slots p * block_pages onwards of the tier's memory, in device pages) under the prefix key
    of its last one; `stats` count device pages.
    """

    __slots__ = ("_pinned", "_pinned_keys", "block_pages", "epoch", "num_total_pages", "spec",
                 "stats", "store")

    def __init__(self, spec: TierSpec, num_total_pages: int, block_pages: int = 1) -> None:
        self.spec = spec
        self.num_total_pages = num_total_pages
        self.block_pages = block_pages
        self.stats = TierStats()
        self.epoch = 0  # counts contents dropped: a lookup from an older epoch may be stale
        self.store = TierStore(spec.eviction, num_total_pages)
        self._pinned: list[int] = []  # pages pinned this step, and their keys
        self._pinned_keys: list[Hashable] = []

    @property
    def kind(self) -> str:
        """host, ssd or remote."""
        return self.spec.kind

    @property
    def num_device_pages(self) -> int:
        """The tier's size in device pages (`block_pages` each of its pages)."""
        return self.num_total_pages * self.block_pages

    @property
    def num_used_pages(self) -> int:
        """Pages holding content (pinned ones included)."""
        return self.store.num_handed_out

    @property
    def num_free_pages(self) -> int:
        """Pages holding nothing."""
        return self.num_total_pages - self.store.num_handed_out

    @property
    def num_pinned_pages(self) -> int:
        """Pages a load of the current step reads."""
        return len(self._pinned)

    def page_of(self, key: Hashable) -> int | None:
        """The page holding `key`, or None."""
        return self.store.get(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.store

    def pin_many(self, pages: list[int], keys: list) -> None:
        """Loads read `pages` (holding `keys`) this step: count the hits and keep the pages
        from being evicted (one pinned already by another load of this step stays so)."""
        assert len(pages) == len(keys), "a key for each page"
        self.stats.num_hits += len(pages) * self.block_pages
        taken = self.store.pin(pages)  # (false for a page pinned already)
        self._pinned += compress(pages, taken)
        self._pinned_keys += compress(keys, taken)

    def unpin_all(self) -> None:
        """The step's loads are decided: the pages read become the most recently used (by
        LRU; other policies order them their own way)."""
        if self._pinned:
            self.store.unpin(self._pinned, self._pinned_keys)
            self._pinned, self._pinned_keys = [], []

    def put_many(self, keys: list) -> tuple[list, list[int], list[int], list]:
        """Give each of `keys` (none held here, no two alike) a page: free pages first, then
        the eviction policy's victims, in its order. Returns (the keys stored, their pages,
        the victims' pages, the victims' keys): when fewer pages are free or evictable than
        keys, the last keys are the ones stored (as one put after another would keep them),
        and a victim is always content from before this call."""
        stored, pages, victim_pages, victim_keys = self.store.put_many(keys)
        if victim_keys:
            self.stats.num_evictions += len(victim_keys) * self.block_pages
            self.epoch += 1
        self.stats.num_stores += len(stored) * self.block_pages
        return stored, pages, victim_pages, victim_keys

    def put_into_free(self, keys: list) -> tuple[list[bool] | None, list[int]]:
        """`put_many` of those of `keys` (no two alike) not held here, where the free pages
        have room for all of them: each takes the next free page. Returns which keys were
        stored (None: all) and their pages."""
        stored, pages = self.store.put_into_free(keys)
        self.stats.num_stores += len(pages) * self.block_pages
        return stored, pages

    def clear(self) -> None:
        """Drop every page's content (no page may be pinned)."""
        assert not self._pinned, "clear a tier while a load reads it"
        self.store.clear()
        self.epoch += 1

    def check(self, *, distinct: bool = True) -> None:
        """Conservation: every page free, or holding one key (and cached, or pinned).
        `distinct`: also that no two keys share a page (a pass over the tier's store)."""
        store = self.store
        assert store.num_cached + len(self._pinned) == store.num_handed_out, \
            "a tier page left its evictor"
        store.check(distinct=distinct)


def build_tiers(config: TiersConfig, page_size: int, page_bytes: int,
                shared: dict[str, PrefixTier] | None = None) -> list[PrefixTier]:
    """The run-time tiers of one instance with device pages of `page_size` tokens and
    `page_bytes` bytes; a kind in `shared` (a cluster's remote pool) is that object, shared,
    instead of a new one."""
    shared = shared or {}
    return [shared.get(spec.kind) or build_tier(config, spec, page_size, page_bytes)
            for spec in config.tiers]


def build_tier(config: TiersConfig, spec: TierSpec, page_size: int,
               page_bytes: int) -> PrefixTier:
    """One tier of `config`, its pages `config.block_size` tokens each."""
    block_pages = config.block_pages(page_size)
    return PrefixTier(spec, spec.num_blocks(page_bytes, block_pages), block_pages)

