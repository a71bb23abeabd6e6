"""Cost-aware eviction: the cached page whose loss costs the least recomputation goes first."""

from __future__ import annotations

from collections.abc import Hashable

from kvlab.policies.eviction.heap import PageHeap
from kvlab.policies.registry import register


@register(
    "eviction",
    "cost",
    help="prefix caching; evict the page cheapest to recompute (shallow, rarely hit) first",
)
class CostAwareEviction:
    """Keyed by the recompute time a future hit would save: (depth + 1) x (hits + 1).

    A page at depth d (tokens d*P..(d+1)*P of a prompt) attends to a prefix of d+1 pages when
    recomputed, so deeper pages cost more; a page that was hit often is likely to be hit again.
    Ties go to the least recently used.
    """

    __slots__ = ("_clock", "_depth", "_heap", "_hits")
    caches = True

    def __init__(self) -> None:
        self._heap = PageHeap()
        self._hits: dict[int, int] = {}
        self._depth: dict[int, int] = {}
        self._clock = 0

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, page_id: int) -> bool:
        return page_id in self._heap

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """The page, holding the prefix `key` at `depth`, became unreferenced."""
        self._clock += 1
        self._depth[page_id] = depth
        saved = (depth + 1) * (self._hits.get(page_id, 0) + 1)
        self._heap.push(page_id, (saved, self._clock), key)

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back."""
        self._heap.discard(page_id)

    def on_hit(self, page_id: int) -> None:
        """Count one more reuse of the page's content."""
        self._hits[page_id] = self._hits.get(page_id, 0) + 1

    def pop_victim(self) -> tuple[int, Hashable]:
        """The page with the least recompute value, and its key. Raises LookupError when none
        is cached."""
        page_id, key = self._heap.pop()
        self._hits.pop(page_id, None)
        self._depth.pop(page_id, None)
        return page_id, key

    def pages(self) -> list[int]:
        """Cached-free pages."""
        return self._heap.pages()
