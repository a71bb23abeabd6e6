"""Least-frequently-used eviction of cached prefix pages (ties: least recently used)."""

from __future__ import annotations

from kvlab.policies.eviction.scored import HitCountEviction
from kvlab.policies.registry import register


@register("eviction", "lfu", help="prefix caching; evict the cached page with the fewest hits")
class LFUEviction(HitCountEviction):
    """Pages keyed by (hits, release order): cold pages go first, then the stalest."""

    __slots__ = ()

    def _priority(self, page_id: int, depth: int) -> tuple:
        self._clock += 1
        return (self._hits.get(page_id, 0), self._clock)
