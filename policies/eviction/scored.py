"""A priority set of pages on a lazy heap, and the eviction policy built on it that the scored
policies (fifo, lfu, cost) share."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator


class PageHeap:
    """Pages ordered by a priority, each with its prefix hash; removal is lazy (stale heap
    entries are skipped on pop)."""

    __slots__ = ("_heap", "_key", "_prefix")

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._key: dict[int, tuple] = {}
        self._prefix: dict[int, Hashable] = {}  # page -> the prefix hash it holds

    def __len__(self) -> int:
        return len(self._key)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._key

    def push(self, page_id: int, key: tuple, prefix: Hashable) -> None:
        """Add a page holding the prefix hash `prefix`, with its priority `key` (smallest pops
        first)."""
        self._key[page_id] = key
        self._prefix[page_id] = prefix
        heapq.heappush(self._heap, (*key, page_id))

    def discard(self, page_id: int) -> None:
        """Remove a page if present."""
        if self._key.pop(page_id, None) is not None:
            del self._prefix[page_id]

    def pop(self) -> tuple[int, Hashable]:
        """The page with the smallest key, and its prefix hash. Raises LookupError when empty."""
        self._drop_stale_top()
        if not self._heap:
            raise LookupError("no cached page to evict")
        page_id = heapq.heappop(self._heap)[-1]
        del self._key[page_id]
        return page_id, self._prefix.pop(page_id)

    def _drop_stale_top(self) -> None:
        """Pop the entries on top whose page left or was pushed again with another key (a
        page pushed again with the same key has two entries alike: the second is stale once
        the first pops)."""
        heap, held = self._heap, self._key
        while heap and held.get(heap[0][-1]) != heap[0][:-1]:
            heapq.heappop(heap)

    def pages(self) -> list[int]:
        """The pages held, in no particular order."""
        return list(self._key)

    def iter_pages(self) -> Iterator[int]:
        """The pages held, lazily, in the heap's array order: the next `pop` first (stale
        entries on top are dropped first, as `pop` drops them), then the rest roughly as they
        will pop (an entry sits above every entry it pops before, so the k-th to pop lies
        within the first 2**k - 1 slots, stale ones aside), for a slice's cost where a sorted
        order would read the whole heap."""
        self._drop_stale_top()  # (under a stale entry its two children are unordered)
        heap, held, seen = self._heap, self._key, set()
        for *key, page_id in heap:  # (a stale entry, or a page's second alike: skipped)
            if page_id not in seen and held.get(page_id) == tuple(key):
                seen.add(page_id)
                yield page_id


class HeapEviction:
    """The shared body of the scored eviction policies: cached-free pages on a `PageHeap`,
    lowest priority evicted first. A subclass gives `_priority(page, depth)`, and may count
    hits (`on_hit`) and forget a page's state when it is evicted (`_forget`)."""

    __slots__ = ("_heap",)
    caches = True

    def __init__(self) -> None:
        self._heap = PageHeap()

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._heap

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key` at `depth`, became unreferenced."""
        self._heap.push(page_id, self._priority(page_id, depth), key)

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back."""
        self._heap.discard(page_id)

    def on_hit(self, page_id: int) -> None:
        """A prefix hit on the page (nothing by default)."""

    def pop_victim(self) -> tuple[int, Hashable]:
        """The page of lowest priority and its key. Raises LookupError when none is cached."""
        page_id, key = self._heap.pop()
        self._forget(page_id)
        return page_id, key

    def pages(self) -> list[int]:
        """Cached-free pages."""
        return self._heap.pages()

    def iter_pages(self) -> Iterator[int]:
        """Cached-free pages, the next victim first, the rest near their eviction order
        (`PageHeap.iter_pages`): what `cached=1` demotes first."""
        return self._heap.iter_pages()

    def _priority(self, page_id: int, depth: int) -> tuple:
        raise NotImplementedError

    def _forget(self, page_id: int) -> None:
        """The page was evicted: its content, and so its history, is gone."""


class HitCountEviction(HeapEviction):
    """A scored policy keyed by the hits on each page's content (lfu, cost): `on_hit` counts
    them until the page is evicted; `_clock` numbers the releases, for ties."""

    __slots__ = ("_clock", "_hits")

    def __init__(self) -> None:
        super().__init__()
        self._hits: dict[int, int] = {}
        self._clock = 0

    def on_hit(self, page_id: int) -> None:
        """Count one more reuse of the page's content."""
        self._hits[page_id] = self._hits.get(page_id, 0) + 1

    def _forget(self, page_id: int) -> None:
        self._hits.pop(page_id, None)
