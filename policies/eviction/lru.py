"""Least-recently-used eviction of cached prefix pages (vLLM's policy)."""

from __future__ import annotations

from collections.abc import Hashable

from kvlab.policies.registry import register

_GONE = -1  # a queue entry whose page a prefix hit took back
_MIN_COMPACT = 4096  # queue entries popped before the queue's consumed head is dropped


@register("eviction", "lru", help="prefix caching; evict the cached page unused the longest (vLLM)")
class LRUEviction:
    """Pages in the order they lost their last owner; the oldest goes first.

    The manager releases a finished sequence's pages tail first, so a prompt's deepest pages are
    evicted before the shared roots they hang from, as in vLLM. `add_pages` and `pop_victims` are
    the batched forms the manager uses when an eviction policy offers them.

    Why not an OrderedDict: this is the hot path of every prefix-caching simulation (each cached
    page is added once and evicted once), and an OrderedDict costs about 270 ns per insertion
    here. Instead a list holds the pages in release order (and a parallel list their prefix
    hashes), with a head index; a page's position is remembered in a dict, so a prefix hit blanks
    its entry in O(1), and adding or evicting a run of pages is a slice, a list extend and a dict
    update: C loops, no Python per page.
    """

    __slots__ = ("_base", "_head", "_keys", "_num_gone", "_num_pages", "_position", "_queue")
    caches = True

    def __init__(self) -> None:
        self._queue: list[int] = []  # pages in release order; _GONE where a hit took one back
        self._keys: list = []  # the prefix hash of each queue entry
        self._head = 0  # index of the oldest entry not yet evicted
        self._base = 0  # entries dropped from the queue's front (positions are absolute)
        self._position: dict[int, int] = {}  # page -> absolute position of its latest entry
        self._num_gone = 0  # _GONE entries at or after the head
        self._num_pages = 0

    def __len__(self) -> int:
        return self._num_pages

    def __contains__(self, page_id: int) -> bool:
        position = self._position.get(page_id)
        if position is None:
            return False
        index = position - self._base
        return index >= self._head and self._queue[index] == page_id

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key`, became unreferenced: now the most recently used."""
        self.add_pages([page_id], [key])

    def add_pages(self, page_ids: list[int], keys: list) -> None:
        """`add` of each page with its key, in order (a freed sequence's, in one call)."""
        end = self._base + len(self._queue)
        self._position.update(zip(page_ids, range(end, end + len(page_ids)), strict=True))
        self._queue.extend(page_ids)
        self._keys.extend(keys)
        self._num_pages += len(page_ids)

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back. Raises KeyError when the page is not cached."""
        index = self._position[page_id] - self._base
        if index < self._head or self._queue[index] != page_id:
            raise KeyError(page_id)
        self._queue[index] = _GONE
        self._num_gone += 1
        self._num_pages -= 1

    def on_hit(self, page_id: int) -> None:
        """Recency is set when the page is released again; nothing to count."""

    def pop_victim(self) -> tuple[int, Hashable]:
        """The least recently used cached page and its key. Raises LookupError when none is
        cached."""
        if not self._num_pages:
            raise LookupError("no cached page to evict")
        queue, head = self._queue, self._head
        while queue[head] == _GONE:
            head += 1
            self._num_gone -= 1
        page, key = queue[head], self._keys[head]
        self._head = head + 1
        self._num_pages -= 1
        if head >= _MIN_COMPACT:  # the test _compact starts with, saving a call per page
            self._compact()
        return page, key

    def pop_victims(self, num_pages: int) -> tuple[list[int], list]:
        """`pop_victim` `num_pages` times: (pages, their keys). Raises LookupError when fewer
        are cached."""
        if num_pages > self._num_pages:
            raise LookupError(f"{num_pages} pages to evict but {self._num_pages} cached")
        queue, head = self._queue, self._head
        end = head + num_pages
        victims = queue[head:end]
        if self._num_gone:
            num_gone = victims.count(_GONE)
            while num_gone:  # step over blanked entries until num_pages live ones are taken
                self._num_gone -= num_gone
                more = queue[end : end + num_gone]
                end += num_gone
                num_gone = more.count(_GONE)
                victims += more
        keys = self._keys[head:end]
        if len(victims) > num_pages:
            keys = [key for page, key in zip(victims, keys, strict=True) if page != _GONE]
            victims = [page for page in victims if page != _GONE]
        self._head = end
        self._num_pages -= num_pages
        self._compact()
        return victims, keys

    def _compact(self) -> None:
        """Drop the evicted front of the queue once it is most of it (amortised O(1))."""
        head = self._head
        if head >= _MIN_COMPACT and head * 2 >= len(self._queue):
            del self._queue[:head]
            del self._keys[:head]
            self._base += head
            self._head = 0

    def pages(self) -> list[int]:
        """Cached-free pages, least recently used first."""
        return [page for page in self._queue[self._head :] if page != _GONE]

