"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003) over the cached-free prefix pages."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence

from kvlab.policies.registry import register


@register(
    "eviction",
    "arc",
    help="prefix caching; ARC: balance once-used and reused pages, adapting on ghost hits",
)
class ARCEviction:
    """ARC's four lists, mapped to a cache whose pages may be held (unevictable).

    T1 holds the cached-free pages whose content was released once and never reused since it
    was cached; T2 those whose content was reused: a prefix hit on the page (`on_hit`, whether
    it was cached-free or held at the time), or content that came back from a ghost list. Both
    are LRU lists ordered by release (`add`), as in vLLM's LRU. A held page is in neither list:
    only cached-free pages can be evicted, so ARC's lists cover exactly those, and a hit that
    takes a page back (`remove`, then `on_hit`) files it under T2 when it is released again.

    B1 and B2 are the ghost lists: the prefix hashes of pages evicted from T1 and T2. A ghost
    hit is a page registered and released with a key found in B1 or B2: content the cache
    dropped and a request had to compute again. It is seen when that page is released (`add`),
    the first moment the policy learns its key. As in ARC, a B1 hit moves the target `p` for
    T1's size up by max(1, |B2|/|B1|) (recency was short of room), a B2 hit moves it down by
    max(1, |B1|/|B2|) (frequency was), and the page goes to T2 (its content was used twice).

    The victim is T1's LRU page while |T1| > p, else T2's (whichever is non-empty). `p` lies in
    [0, c] with c the pool size, and each ghost list keeps at most c keys (oldest dropped
    first): the contents a pool of c pages could have held. c is `num_total_pages` when given,
    else learned as the largest page id seen plus one (the allocators number pages from 0, so
    it reaches the pool size as the pool fills).

    A page hit while held whose content is then dropped without being released to the cache
    (rare: unwritten pages of a preempted sequence) keeps its reuse mark for its next content.
    """

    __slots__ = ("_b1", "_b2", "_capacity", "_fixed_capacity", "_p", "_reused", "_t1", "_t2",
                 "num_ghost_hits_frequent", "num_ghost_hits_recent")
    caches = True

    def __init__(self, num_total_pages: int | None = None) -> None:
        self._t1: OrderedDict[int, Hashable] = OrderedDict()  # page -> key, LRU first
        self._t2: OrderedDict[int, Hashable] = OrderedDict()
        self._b1: OrderedDict[Hashable, None] = OrderedDict()  # evicted keys, oldest first
        self._b2: OrderedDict[Hashable, None] = OrderedDict()
        self._reused: set[int] = set()  # held pages hit since they were last cached-free
        self._fixed_capacity = num_total_pages is not None
        self._capacity = num_total_pages or 0
        self._p = 0.0
        self.num_ghost_hits_recent = 0  # B1 hits
        self.num_ghost_hits_frequent = 0  # B2 hits

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._t1 or page_id in self._t2

    @property
    def target_recent_pages(self) -> float:
        """ARC's p: the size T1 (once-used pages) is aimed at before T2 gives up pages."""
        return self._p

    @property
    def num_recent_pages(self) -> int:
        """|T1|: cached-free pages whose content was not reused since it was cached."""
        return len(self._t1)

    @property
    def num_frequent_pages(self) -> int:
        """|T2|: cached-free pages whose content was reused."""
        return len(self._t2)

    def ghost_keys(self) -> tuple[list[Hashable], list[Hashable]]:
        """The keys of B1 and B2, oldest first."""
        return list(self._b1), list(self._b2)

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key`, became unreferenced: the MRU end of T2 if its
        content was reused or is a ghost hit (which moves p), else of T1."""
        self.add_pages([page_id], [key])

    def add_pages(self, page_ids: Sequence[int], keys: list) -> None:
        """`add` of each page with its key, in order (a freed sequence's, in one call)."""
        if not page_ids:
            return
        if not self._fixed_capacity:
            top = max(page_ids) + 1
            if top > self._capacity:
                self._capacity = top
        t1, t2, b1, b2, reused = self._t1, self._t2, self._b1, self._b2, self._reused
        for page, key in zip(page_ids, keys, strict=True):
            frequent = False
            if reused and page in reused:
                reused.discard(page)
                frequent = True
            if b1 and key in b1:  # ARC's delta, from the list sizes before the ghost leaves
                self._p = min(float(self._capacity), self._p + max(1.0, len(b2) / len(b1)))
                del b1[key]
                self.num_ghost_hits_recent += 1
                frequent = True
            elif b2 and key in b2:
                self._p = max(0.0, self._p - max(1.0, len(b1) / len(b2)))
                del b2[key]
                self.num_ghost_hits_frequent += 1
                frequent = True
            if frequent:
                t2[page] = key
            else:
                t1[page] = key

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back. Raises KeyError when the page is not cached."""
        if self._t1.pop(page_id, None) is None and self._t2.pop(page_id, None) is None:
            raise KeyError(page_id)

    def on_hit(self, page_id: int) -> None:
        """A prefix hit: the page's content is reused, so it belongs to T2 (now, if it is
        cached-free; when it is released, if held)."""
        if page_id in self._t1:
            self._t2[page_id] = self._t1.pop(page_id)
        elif page_id in self._t2:
            self._t2.move_to_end(page_id)
        else:
            self._reused.add(page_id)

    def pop_victim(self) -> tuple[int, Hashable]:
        """T1's LRU page while |T1| > p, else T2's, and its key; the key becomes a ghost.
        Raises LookupError when none is cached."""
        t1, t2 = self._t1, self._t2
        if t1 and (len(t1) > self._p or not t2):
            page, key = t1.popitem(last=False)
            ghosts, other = self._b1, self._b2
        elif t2:
            page, key = t2.popitem(last=False)
            ghosts, other = self._b2, self._b1
        else:
            raise LookupError("no cached page to evict")
        other.pop(key, None)
        ghosts[key] = None
        if len(ghosts) > self._capacity:
            ghosts.popitem(last=False)
        return page, key

    def pop_victims(self, num_pages: int) -> tuple[list[int], list]:
        """`pop_victim` `num_pages` times: (pages, their keys). Raises LookupError when fewer
        are cached."""
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        if num_pages > len(t1) + len(t2):
            raise LookupError(f"{num_pages} pages to evict but {len(self)} cached")
        # pop_victim's body inlined: this is the eviction hot path (a call per page costs more
        # than the work).
        p, capacity = self._p, self._capacity
        pages: list[int] = []
        keys: list = []
        for _ in range(num_pages):
            if t1 and (len(t1) > p or not t2):
                page, key = t1.popitem(last=False)
                if b2:
                    b2.pop(key, None)
                b1[key] = None
                if len(b1) > capacity:
                    b1.popitem(last=False)
            else:
                page, key = t2.popitem(last=False)
                if b1:
                    b1.pop(key, None)
                b2[key] = None
                if len(b2) > capacity:
                    b2.popitem(last=False)
            pages.append(page)
            keys.append(key)
        return pages, keys

    def pages(self) -> list[int]:
        """Cached-free pages: T1 then T2, each least recently released first."""
        return list(self.iter_pages())

    def iter_pages(self) -> Iterator[int]:
        """`pages()`, lazily (a scan that stops early reads no more of them)."""
        return itertools.chain(self._t1, self._t2)
