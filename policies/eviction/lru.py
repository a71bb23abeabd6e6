"""Least-recently-used eviction of cached prefix pages (vLLM's policy)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvlab.policies.registry import register


@register("eviction", "lru", help="prefix caching; evict the cached page unused the longest (vLLM)")
class LRUEviction:
    """Pages in the order they lost their last owner; the oldest goes first.

    The manager releases a finished sequence's pages tail first, so a prompt's deepest pages are
    evicted before the shared roots they hang from, as in vLLM. `add_pages` and `pop_victims` are
    the batched forms the manager uses when an eviction policy offers them.
    """

    __slots__ = ("_order",)
    caches = True

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def add(self, page_id: int, depth: int) -> None:
        """The page became unreferenced: it is now the most recently used."""
        self._order[page_id] = None

    def add_pages(self, page_ids: list[int], depth_of: Sequence[int]) -> None:
        """`add(page, depth_of[page])` of each page in order (a freed sequence's, in one call)."""
        # A plain loop: OrderedDict.update(dict.fromkeys(...)) measured twice as slow.
        order = self._order
        for page_id in page_ids:
            order[page_id] = None

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back."""
        del self._order[page_id]

    def on_hit(self, page_id: int) -> None:
        """Recency is set when the page is released again; nothing to count."""

    def pop_victim(self) -> int:
        """The least recently used cached page. Raises LookupError when none is cached."""
        if not self._order:
            raise LookupError("no cached page to evict")
        return self._order.popitem(last=False)[0]

    def pop_victims(self, num_pages: int) -> list[int]:
        """`pop_victim` `num_pages` times. Raises LookupError when fewer are cached."""
        if num_pages > len(self._order):
            raise LookupError(f"{num_pages} pages to evict but {len(self._order)} cached")
        pop = self._order.popitem
        return [pop(False)[0] for _ in range(num_pages)]

    def pages(self) -> list[int]:
        """Cached-free pages, least recently used first."""
        return list(self._order)
