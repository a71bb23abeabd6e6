"""Segmented LRU eviction of cached prefix pages: reused pages are protected from a scan."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence

from kvlab.policies.registry import register

DEFAULT_PROTECTED_SHARE = 0.8


@register(
    "eviction",
    "slru",
    help="prefix caching; segmented LRU: reused pages are protected, once-used ones go first",
)
class SLRUEviction:
    """Two LRU segments of cached-free pages, each ordered by release (`add`).

    A page enters the probationary segment when its content is released for the first time
    since it was cached. A prefix hit on the page (`on_hit`: while it is cached-free, or while
    a sequence holds it) sends it to the MRU end of the protected segment: at once if it is
    cached-free, else when it is released. The protected segment holds at most
    floor(`protected_share` x cached-free pages) pages (80% by default); whenever it holds more,
    its LRU page is demoted to the MRU end of the probationary segment. Victims come from the
    probationary LRU end, and from the protected LRU end only when the probationary segment is
    empty (which the cap rules out while any page is cached, unless the share is 1).

    A page hit while held whose content is then dropped without being released to the cache
    (rare: unwritten pages of a preempted sequence) keeps its reuse mark for its next content.
    """

    __slots__ = ("_probation", "_protected", "_reused", "num_demotions", "protected_share")
    caches = True

    def __init__(self, protected_share: float = DEFAULT_PROTECTED_SHARE) -> None:
        if not 0.0 <= protected_share <= 1.0:
            raise ValueError("protected_share must be in [0, 1]")
        self.protected_share = protected_share
        self._probation: OrderedDict[int, Hashable] = OrderedDict()  # page -> key, LRU first
        self._protected: OrderedDict[int, Hashable] = OrderedDict()
        self._reused: set[int] = set()  # held pages hit since they were last cached-free
        self.num_demotions = 0

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._probation or page_id in self._protected

    @property
    def num_protected_pages(self) -> int:
        """Pages in the protected segment."""
        return len(self._protected)

    def segments(self) -> tuple[list[int], list[int]]:
        """The (probationary, protected) pages, each least recently released first."""
        return list(self._probation), list(self._protected)

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key`, became unreferenced: the protected MRU end if it
        was hit since it was last cached-free, else the probationary one."""
        self.add_pages([page_id], [key])

    def add_pages(self, page_ids: Sequence[int], keys: list) -> None:
        """`add` of each page with its key, in order (a freed sequence's, in one call)."""
        probation, protected, reused = self._probation, self._protected, self._reused
        for page, key in zip(page_ids, keys, strict=True):
            if reused and page in reused:
                reused.discard(page)
                protected[page] = key
                self._demote_overflow()
            else:
                probation[page] = key

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back. Raises KeyError when the page is not cached."""
        if self._probation.pop(page_id, None) is None:
            if self._protected.pop(page_id, None) is None:
                raise KeyError(page_id)
        else:
            self._demote_overflow()

    def on_hit(self, page_id: int) -> None:
        """A prefix hit: the page's content is reused, so it is protected (now, if it is
        cached-free; when it is released, if held)."""
        if page_id in self._probation:
            self._protected[page_id] = self._probation.pop(page_id)
            self._demote_overflow()
        elif page_id in self._protected:
            self._protected.move_to_end(page_id)
        else:
            self._reused.add(page_id)

    def pop_victim(self) -> tuple[int, Hashable]:
        """The probationary LRU page (else the protected one) and its key. Raises LookupError
        when none is cached."""
        if self._probation:
            victim = self._probation.popitem(last=False)
            self._demote_overflow()
            return victim
        if self._protected:
            return self._protected.popitem(last=False)
        raise LookupError("no cached page to evict")

    def pop_victims(self, num_pages: int) -> tuple[list[int], list]:
        """`pop_victim` `num_pages` times: (pages, their keys). Raises LookupError when fewer
        are cached."""
        probation, protected = self._probation, self._protected
        if num_pages > len(probation) + len(protected):
            raise LookupError(f"{num_pages} pages to evict but {len(self)} cached")
        # pop_victim and _demote_overflow inlined: this is the eviction hot path (a call per
        # page costs more than the work).
        share = self.protected_share
        pages: list[int] = []
        keys: list = []
        for _ in range(num_pages):
            if probation:
                page, key = probation.popitem(last=False)
                while len(protected) > int(share * (len(protected) + len(probation))):
                    demoted, demoted_key = protected.popitem(last=False)
                    probation[demoted] = demoted_key
                    self.num_demotions += 1
            else:
                page, key = protected.popitem(last=False)
            pages.append(page)
            keys.append(key)
        return pages, keys

    def pages(self) -> list[int]:
        """Cached-free pages: probationary then protected, each least recently released first."""
        return list(self.iter_pages())

    def iter_pages(self) -> Iterator[int]:
        """`pages()`, lazily (a scan that stops early reads no more of them)."""
        return itertools.chain(self._probation, self._protected)

    def _demote_overflow(self) -> None:
        """Move protected LRU pages to the probationary MRU end while the protected segment is
        over its share of the cached-free pages."""
        protected, probation = self._protected, self._probation
        cap = int(self.protected_share * (len(protected) + len(probation)))
        while len(protected) > cap:
            page, key = protected.popitem(last=False)
            probation[page] = key
            self.num_demotions += 1
