"""A tier's pages: which key each holds and the order they are evicted in (`TierStore`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from itertools import compress

from kvlab.policies import registry
from kvlab.policies.interfaces import Eviction, add_cached, pop_victims, recycle, take_hits


class TierStore:
    """A tier's pages: which key each holds (a dict, key -> page) and the order they are evicted
    in (an eviction policy of the registry: the device's policies, over tier pages, which hold
    no owner). Pages 0 .. num_handed_out - 1 hold content (a page is never freed alone: content
    leaves only by eviction, which reuses the page at once), so the free pages are the tail of
    the range. Cached pages are evictable; a pinned one (a load of this step reads it) is not.
    """

    __slots__ = ("_num_handed_out", "_page_of", "eviction", "evictor", "num_total")

    def __init__(self, eviction: str, num_pages: int) -> None:
        self.num_total = num_pages
        self.eviction = eviction
        self.evictor: Eviction = registry.get("eviction", eviction).factory()
        self._page_of: dict[Hashable, int] = {}
        self._num_handed_out = 0

    @property
    def num_handed_out(self) -> int:
        """Pages holding content."""
        return self._num_handed_out

    @property
    def num_cached(self) -> int:
        """Pages evictable."""
        return len(self.evictor)

    def __contains__(self, key: object) -> bool:
        return key in self._page_of

    def get(self, key: Hashable) -> int | None:
        """The page holding `key`, or None."""
        return self._page_of.get(key)

    def pages_of(self, keys: list) -> list[int | None]:
        """Each key's page, or None."""
        return list(map(self._page_of.get, keys))

    def holds_each(self, keys: list) -> list[bool]:
        """Whether each key is held."""
        return list(map(self._page_of.__contains__, keys))

    def holds_any(self, keys: list) -> bool:
        """Whether any key is held."""
        return not self._page_of.keys().isdisjoint(keys)

    def put_many(self, keys: list) -> tuple[list, list[int], list[int], list]:
        """`PrefixTier.put_many`, but for the counters."""
        first_free = self._num_handed_out
        num_free = min(len(keys), self.num_total - first_free)
        num_victims = min(len(keys) - num_free, len(self.evictor))
        keys = keys[len(keys) - num_free - num_victims :]
        if not num_victims:  # the free pages hold them all (a tier filling up)
            return keys, self.put_into_free(keys)[1], [], []
        pages = list(range(first_free, first_free + num_free))
        self._num_handed_out += num_free
        if not num_free:  # full: the oldest pages take the new content
            victim_pages, victim_keys = recycle(self.evictor, num_victims, keys)
            pages = list(victim_pages)
        else:
            victim_pages, victim_keys = pop_victims(self.evictor, num_victims)
            pages += victim_pages
            add_cached(self.evictor, pages, keys)
        deque(map(self._page_of.pop, victim_keys), maxlen=0)  # their content is gone
        self._page_of.update(zip(keys, pages, strict=True))
        return keys, pages, victim_pages, victim_keys

    def put_into_free(self, keys: list) -> tuple[list[bool] | None, list[int]]:
        """`PrefixTier.put_into_free`, but for the counters."""
        assert len(keys) <= self.num_total - self._num_handed_out, "more keys than free pages"
        first, page_of = self._num_handed_out, self._page_of
        fresh = range(first, first + len(keys))
        pages = list(fresh)
        found = list(map(page_of.setdefault, keys, pages))
        stored: list[bool] | None = None
        if found != pages:  # some were held (at pages below `first`): the rest in a row again
            stored = [page is fresh_page for page, fresh_page in zip(found, pages, strict=True)]
            keys = list(compress(keys, stored))
            deque(map(page_of.pop, keys), maxlen=0)
            fresh = range(first, first + len(keys))
            pages = list(fresh)
            page_of.update(zip(keys, pages, strict=True))
        self._num_handed_out += len(keys)
        add_cached(self.evictor, fresh, keys)
        return stored, pages

    def pin(self, pages: list[int]) -> list[bool]:
        """Take the cached ones of `pages` out of the eviction order; whether each was."""
        return take_hits(self.evictor, pages)

    def unpin(self, pages: list[int], keys: list) -> None:
        """Pinned `pages` (holding `keys`) are evictable again: the most recently used (by
        LRU; other policies order them their own way), in order."""
        add_cached(self.evictor, pages, keys)

    def clear(self) -> None:
        """Drop every page's content (none pinned)."""
        self.evictor = registry.get("eviction", self.eviction).factory()
        self._page_of.clear()
        self._num_handed_out = 0

    def keys(self) -> list:
        """The keys held."""
        return list(self._page_of)

    def check(self, *, distinct: bool = True) -> None:
        """Every page holding content holds a key; `distinct`: one only (a pass over the
        store)."""
        used = len(self._page_of)
        assert used == self._num_handed_out, "a tier page was lost (or holds two keys)"
        if distinct:
            assert len(set(self._page_of.values())) == used, "a tier page holds two keys"

