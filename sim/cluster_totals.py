"""The whole cluster as one run, from its instances' runs: every request, every instance's
steps and inter-token gaps, and the instances' tier counters added up (a pool shared by them
counted once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.metrics import RunResult
from kvlab.metrics.run_result import combine_runs
from kvlab.policies import Request
from kvlab.policies.tiers import PrefixTier, TierStats
from kvlab.sim.assembly import duration_s, scheduled_prompt_tokens, tier_stats
from kvlab.sim.cluster_instance import ClusterInstance


def whole_cluster_run(requests: list[Request], runs: Sequence[RunResult],
                      metadata: dict[str, Any]) -> RunResult:
    """One run of every request (`requests`, in trace order) and every instance's steps
    (instance by instance), with one instance's memory fields (every instance has the same
    memory shape), lasting from the first arrival to the last finish."""
    return combine_runs(runs, requests, duration_s(requests), metadata)


def cluster_tier_stats(instances: Sequence[ClusterInstance], shared_tiers: dict[str, PrefixTier],
                       requests: Sequence[Request]) -> dict[str, Any]:
    """The instances' tier counters added up (pages, hits, stores, evictions, link time),
    each level's hit rate over the prompt tokens of all the scheduled `requests`; none
    without tiers. Each instance has its own tiers and its own share of a pool shared by
    them (`shared_tiers`; its manager's `tier_stats`): the shares add up to the pool's
    counters, and the pool's pages count once."""
    instances = [i for i in instances if i.tiers is not None]
    if not instances:
        return {}
    total: dict[str, Any] = {}
    for instance in instances:
        for key, value in tier_stats(instance.manager, instance.tiers, instance.tier_links,
                                     instance.requests).items():
            total[key] = total.get(key, 0) + value
    for kind, pool in shared_tiers.items():  # one pool: its pages once, not N times
        total[f"{kind}_tier_pages"] = pool.num_device_pages
        level = [tier.kind for tier in instances[0].tiers or ()].index(kind)
        shares = TierStats()
        for instance in instances:
            shares.add(instance.manager.tier_stats[level])
        assert shares == pool.stats, f"the {kind} pool's counters differ from its shares"
    # rates: first-admission hits of every level over every scheduled prompt token
    prompt_tokens = scheduled_prompt_tokens(requests)
    levels = ["device_prefix_hit_rate_perc"] + [
        f"{tier.kind}_tier_hit_rate_perc" for tier in instances[0].tiers or ()]
    page_size = instances[0].manager.page_size
    for level, key in enumerate(levels):
        pages = sum(i.manager.first_hit_pages[level] for i in instances)
        total[key] = 100.0 * pages * page_size / prompt_tokens if prompt_tokens else 0.0
    return total
