"""Least-recently-used eviction of cached prefix pages (vLLM's policy)."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterator, Sequence

from kvlab.policies.registry import register

_MIN_COMPACT = 4096  # queue entries popped before the queue's consumed head is dropped


@register("eviction", "lru", help="prefix caching; evict the cached page unused the longest (vLLM)")
class LRUEviction:
    """Pages in the order they lost their last owner; the oldest goes first.

    The manager releases a finished sequence's pages tail first, so a prompt's deepest pages are
    evicted before the shared roots they hang from, as in vLLM. `add_pages` and `pop_victims` are
    the batched forms the manager uses when an eviction policy offers them.

    Why this shape: it is the hot path of every prefix-caching simulation (each cached page is
    added once and evicted once), and on this kind of machine a random access to a structure the
    size of the page pool costs hundreds of nanoseconds. So a list holds the pages in release
    order (and a parallel list their prefix hashes), with a head index, and a one-byte flag per
    page says which are cached-free. A prefix hit that takes a page back clears its flag and
    counts its queue entry as stale; the entry is skipped when it reaches the head. Stale entries
    of a page always come before its live one (a page has one live entry, its latest), so a
    count per page is enough. Adding or evicting a run of pages is a slice and a list extend,
    plus one flag per page in a table a few hundred kilobytes long.
    """

    __slots__ = ("_flags", "_head", "_keys", "_num_pages", "_queue", "_stale")
    caches = True

    def __init__(self) -> None:
        self._queue: list[int] = []  # pages in release order, some entries stale
        self._keys: list = []  # the prefix hash of each queue entry
        self._head = 0  # index of the oldest entry not yet evicted
        self._flags = bytearray()  # page -> 1 while it is cached-free (grown on demand)
        # page -> how many of its entries in queue[head:] a hit made stale (only pages with some)
        self._stale: dict[int, int] = {}
        self._num_pages = 0

    def __len__(self) -> int:
        return self._num_pages

    def __contains__(self, page_id: int) -> bool:
        return page_id < len(self._flags) and self._flags[page_id] == 1

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key`, became unreferenced: now the most recently used."""
        self.add_pages([page_id], [key])

    def add_pages(self, page_ids: Sequence[int], keys: list) -> None:
        """`add` of each page with its key, in order (a freed sequence's, in one call; a
        `range`: fresh pages in a row, a tier filling up, flagged in one slice)."""
        if not page_ids:
            return
        flags = self._flags
        if isinstance(page_ids, range) and page_ids.step == 1:
            start, stop = page_ids.start, page_ids.stop
            if stop > len(flags):
                flags.extend(bytes(stop - len(flags)))
            flags[start:stop] = b"\x01" * (stop - start)
        else:
            top = max(page_ids)
            if top >= len(flags):
                flags.extend(bytes(top + 1 - len(flags)))
            for page in page_ids:
                flags[page] = 1
        self._queue.extend(page_ids)
        self._keys.extend(keys)
        self._num_pages += len(page_ids)

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back. Raises KeyError when the page is not cached."""
        if page_id not in self:
            raise KeyError(page_id)
        self._flags[page_id] = 0
        self._stale[page_id] = self._stale.get(page_id, 0) + 1
        self._num_pages -= 1

    def take_hits(self, page_ids: list[int]) -> list[bool]:
        """`remove` of each page that is cached (on a hit); whether each was."""
        flags, stale = self._flags, self._stale
        num_flags = len(flags)
        taken = []
        for page in page_ids:
            if page < num_flags and flags[page] == 1:
                flags[page] = 0
                stale[page] = stale.get(page, 0) + 1
                taken.append(True)
            else:
                taken.append(False)
        self._num_pages -= taken.count(True)
        return taken

    def on_hit(self, page_id: int) -> None:
        """Recency is set when the page is released again; nothing to count."""

    def pop_victim(self) -> tuple[int, Hashable]:
        """The least recently used cached page and its key. Raises LookupError when none is
        cached."""
        if not self._num_pages:
            raise LookupError("no cached page to evict")
        queue, head, stale = self._queue, self._head, self._stale
        page = queue[head]
        while stale and page in stale:
            self._skip_stale(page)
            head += 1
            page = queue[head]
        key = self._keys[head]
        self._flags[page] = 0
        self._head = head + 1
        self._num_pages -= 1
        if head >= _MIN_COMPACT and head * 3 >= len(queue):  # _compact's test, inlined: it
            self._compact()  # saves a call per evicted page
        return page, key

    def pop_victims(self, num_pages: int) -> tuple[list[int], list]:
        """`pop_victim` `num_pages` times: (pages, their keys). Raises LookupError when fewer
        are cached."""
        victims, keys = self._take_oldest(num_pages)
        flags = self._flags
        for page in victims:
            flags[page] = 0
        self._num_pages -= num_pages
        self._compact()
        return victims, keys

    def recycle(self, num_pages: int, keys: list) -> tuple[list[int], list]:
        """`pop_victims(num_pages)`, then `add_pages` of those pages with `keys`: the oldest
        pages move to the queue's tail with their new keys, their flags left set (cached-free
        before and after). Returns the pages and the keys they held."""
        victims, old_keys = self._take_oldest(num_pages)
        self._queue.extend(victims)
        self._keys.extend(keys)
        self._compact()
        return victims, old_keys

    def _take_oldest(self, num_pages: int) -> tuple[list[int], list]:
        """The `num_pages` oldest live entries (pages, keys), now behind the head; their flags
        and the page count are the caller's. Raises LookupError when fewer are cached."""
        if num_pages > self._num_pages:
            raise LookupError(f"{num_pages} pages to evict but {self._num_pages} cached")
        head = self._head
        end = head + num_pages
        victims = self._queue[head:end]
        keys = self._keys[head:end]
        stale = self._stale
        if stale and not stale.keys().isdisjoint(victims):
            victims, keys, end = self._live_entries(num_pages)
        self._head = end
        return victims, keys

    def _live_entries(self, num_pages: int) -> tuple[list[int], list, int]:
        """The first `num_pages` live entries from the head, skipping (and uncounting) stale
        ones: (pages, keys, index after the last)."""
        queue, keys, index = self._queue, self._keys, self._head
        stale = self._stale
        pages: list[int] = []
        live_keys: list = []
        while len(pages) < num_pages:
            page = queue[index]
            if page in stale:
                self._skip_stale(page)
            else:
                pages.append(page)
                live_keys.append(keys[index])
            index += 1
        return pages, live_keys, index

    def _skip_stale(self, page: int) -> None:
        """One stale entry of `page` leaves the queue."""
        count = self._stale[page]
        if count > 1:
            self._stale[page] = count - 1
        else:
            del self._stale[page]

    def _compact(self) -> None:
        """Drop the evicted front of the queue once it is a third of it (amortised O(1): two
        entries moved per entry dropped). Why a third, not a half: the lists keep their room
        (a list shrinks its allocation only below half of it), so the entries added until the
        next compaction fit without a reallocation; compacting at a half shrank them, and
        regrowing reallocated them in ~12% steps (a full 131k-page tier storing over its
        oldest pages: 10-15% less time)."""
        head = self._head
        if head >= _MIN_COMPACT and head * 3 >= len(self._queue):
            del self._queue[:head]
            del self._keys[:head]
            self._head = 0

    def pages(self) -> list[int]:
        """Cached-free pages, least recently used first."""
        return list(self.iter_pages())

    def next_victims(self, num_pages: int) -> list[int]:
        """The first `num_pages` of `pages` (fewer where fewer are cached): a slice of the
        queue where no stale entry is in it."""
        window = self._queue[self._head : self._head + num_pages]
        if not self._stale or self._stale.keys().isdisjoint(window):
            return window
        return list(itertools.islice(self.iter_pages(), num_pages))

    def iter_pages(self) -> Iterator[int]:
        """`pages` one at a time (a caller that stops early pays for what it read; no page
        may be added or taken meanwhile)."""
        stale = self._stale  # a page's first `stale[page]` entries in the queue are dead
        skipped: dict[int, int] = {}
        queue = self._queue
        for index in range(self._head, len(queue)):
            page = queue[index]
            count = stale.get(page)
            if count:
                done = skipped.get(page, 0)
                if done < count:
                    skipped[page] = done + 1
                    continue
            yield page
