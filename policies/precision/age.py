"""Age-based demotion: keep a sequence's most recent tokens at the cache's dtype and step older
full pages down the precision ladder, one level per `recent` tokens of age."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.policies.registry import register


@register("precision", "age", help=(
    "demote full pages older than the newest `recent` tokens one level (fp8), and one level more "
    "per further `recent` tokens, down `depth` levels; `pressure` > 0: only while less than that "
    "share of pages is free or cached; `cached=1`: demote cached free prefix pages to the lowest "
    "level before they are evicted; `recompute=1`: a prefix hit stops at a demoted page"))
@dataclass(slots=True, frozen=True)
class AgeDemotion:
    """The rule: page i of a sequence of n computed tokens (pages of P tokens) is at level
    k = the largest k <= depth with (i + 1) * P <= n - k * recent (level 0: the cache's dtype).

    `pressure` is a share of the pool's pages: 0 demotes every step; > 0 only at the start of
    a step where fewer than that share of pages are free or cached-free (before the scheduler
    would preempt). `cached` (0 or 1) also demotes cached-free prefix pages, in eviction
    order, to the lowest level. `recompute` (0 or 1): a demoted page leaves the prefix-cache
    index (its precision is part of its identity), so later prompts recompute it; 0 serves hits
    on demoted pages as they are.
    """

    recent: int = 256
    depth: int = 1
    pressure: float = 0.0
    cached: int = 1
    recompute: int = 0

    demotes = True

    def __post_init__(self) -> None:
        if self.recent < 1:
            raise ValueError("recent must be >= 1")
        if self.depth < 1:
            raise ValueError("depth must be >= 1")
        if not 0.0 <= self.pressure <= 1.0:
            raise ValueError("pressure must be in [0, 1]")
        if self.cached not in (0, 1) or self.recompute not in (0, 1):
            raise ValueError("cached and recompute are 0 or 1")
        if self.cached and self.recompute:
            raise ValueError("cached=1 needs recompute=0: a cached page is kept only for hits")

    def num_pages_at_least(self, level: int, num_tokens: int, page_size: int) -> int:
        """How many leading pages of a sequence of `num_tokens` computed tokens belong at
        `level` or lower precision (level >= 1)."""
        return max(0, (num_tokens - level * self.recent) // page_size)

    def under_pressure(self, num_reclaimable: int, num_pages: int) -> bool:
        """Whether to demote this step, with `num_reclaimable` free or cached-free pages of
        `num_pages`."""
        return self.pressure == 0.0 or num_reclaimable < self.pressure * num_pages
