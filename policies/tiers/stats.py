"""What the tiers did: a tier's counters over a run and the run's summary keys for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.policies.tiers.prefix_tier import PrefixTier

@dataclass(slots=True)
class TierStats:
    """What one tier did over a run, in device pages (a tier page of several counts them all)."""

    num_hits: int = 0  # prefix pages found here (and loaded to the device)
    num_stores: int = 0  # pages written here (from the device or the tier above)
    num_evictions: int = 0  # pages whose content this tier dropped (or moved down)
    num_demotions: int = 0  # of those, moved to the next tier

    def add(self, other: TierStats) -> None:
        """Count `other`'s pages in too (one pool's counters from each instance's share)."""
        self.num_hits += other.num_hits
        self.num_stores += other.num_stores
        self.num_evictions += other.num_evictions
        self.num_demotions += other.num_demotions

    def summary(self, kind: str) -> dict[str, int]:
        """The counters as summary keys of a tier of `kind` (`<kind>_tier_hit_pages`, ...)."""
        key = f"{kind}_tier"
        return {f"{key}_hit_pages": self.num_hits, f"{key}_stored_pages": self.num_stores,
                f"{key}_evicted_pages": self.num_evictions,
                f"{key}_demoted_pages": self.num_demotions}


def tier_summary(tiers: list[PrefixTier], stats: list[TierStats], first_hit_pages: list[int],
                 page_size: int, num_prompt_tokens: int,
                 busy_s: list[float] | None = None) -> dict[str, Any]:
    """A run's tier counters as flat summary keys. Hit rates are shares of the prompt tokens
    of the requests scheduled, hit at their first admission, as `prefix_cache_hit_rate_perc`
    counts them (which is their sum): the device's own, then each tier's (`<kind>_tier_...`);
    then per tier its size in device pages and, from `stats` (the run's own counters: a manager's
    `tier_stats`, its share of a pool shared by a cluster), pages hit (every admission,
    re-admissions after a preemption too), stored, evicted, moved down and, from the
    simulator, its link's busy seconds."""
    def rate(pages: int) -> float:
        return 100.0 * pages * page_size / num_prompt_tokens if num_prompt_tokens else 0.0

    summary: dict[str, Any] = {"device_prefix_hit_rate_perc": rate(first_hit_pages[0])}
    for index, tier in enumerate(tiers):
        key = f"{tier.kind}_tier"
        summary[f"{key}_pages"] = tier.num_device_pages
        summary[f"{key}_hit_rate_perc"] = rate(first_hit_pages[index + 1])
        summary.update(stats[index].summary(tier.kind))
        if busy_s is not None:
            summary[f"{key}_link_busy_s"] = busy_s[index]
    return summary
