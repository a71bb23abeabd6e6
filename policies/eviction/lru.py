"""Least-recently-used eviction of cached prefix pages (vLLM's policy)."""

from __future__ import annotations

from collections import OrderedDict

from kvlab.policies.registry import register


@register("eviction", "lru", help="prefix caching; evict the cached page unused the longest (vLLM)")
class LRUEviction:
    """Pages in the order they lost their last owner; the oldest goes first.

    The manager releases a finished sequence's pages tail first, so a prompt's deepest pages are
    evicted before the shared roots they hang from, as in vLLM.
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

    def pages(self) -> list[int]:
        """Cached-free pages, least recently used first."""
        return list(self._order)
