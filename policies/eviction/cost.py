"""Cost-aware eviction: the cached page whose loss costs the least recomputation goes first."""

from __future__ import annotations

from kvlab.policies.eviction.scored import HitCountEviction
from kvlab.policies.registry import register


@register(
    "eviction",
    "cost",
    help="prefix caching; evict the page cheapest to recompute (shallow, rarely hit) first",
)
class CostAwareEviction(HitCountEviction):
    """Keyed by the recompute time a future hit would save: (depth + 1) x (hits + 1).

    A page at depth d (tokens d*P..(d+1)*P of a prompt) attends to a prefix of d+1 pages when
    recomputed, so deeper pages cost more; a page that was hit often is likely to be hit again.
    Ties go to the least recently used.
    """

    __slots__ = ()

    def _priority(self, page_id: int, depth: int) -> tuple:
        self._clock += 1
        return ((depth + 1) * (self._hits.get(page_id, 0) + 1), self._clock)
