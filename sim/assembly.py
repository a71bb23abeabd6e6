"""The parts of one simulated instance that every simulation builds alike from its `SimConfig`
(its cost model, memory tiers, KV-cache manager and tier links, and the tier counters of its
result), for `Simulation` and for each instance of a `Cluster`: a setting added here reaches
both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import simpy

from kvlab.policies import KVCacheManager, Request
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.policies.tiers import PrefixTier, build_tiers, tier_summary
from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel, RooflineCostModel
from kvlab.sim.link import HostLink, TierLinks


def default_cost_model(config: SimConfig) -> CostModel:
    """The calibrated model the config loaded (`SimConfig.calibrated`), else the roofline of
    its model and hardware."""
    if config.calibrated is not None:
        return config.calibrated
    return RooflineCostModel(
        config.model_spec,
        config.hardware_spec,
        page_size=config.policy.block_size,
        tensor_parallel_size=config.tensor_parallel_size,
    )


def instance_tiers(config: SimConfig,
                   shared: dict[str, PrefixTier] | None = None) -> list[PrefixTier] | None:
    """The memory tiers of one instance of `config` (None without `kv_tiers`); a kind in
    `shared` (a cluster's remote pool) is that tier object, shared."""
    tier_config = config.serving.kv_tiers
    return build_tiers(tier_config, config.page_bytes, shared) if tier_config else None


def build_manager(config: SimConfig, cost_model: CostModel,
                  preemption_costs: PreemptionCosts | None = None,
                  tiers: list[PrefixTier] | None = None) -> KVCacheManager:
    """A fresh KV-cache manager of the config's policy and capacity over `tiers`;
    preemption=auto compares swap and recompute with `preemption_costs` (default:
    `cost_model`)."""
    num_pages = config.capacity.num_pages
    return KVCacheManager(
        config.policy,
        num_pages,
        max_model_len=config.scheduler_config().max_model_len,
        num_host_pages=config.serving.num_host_pages(num_pages),
        costs=cost_model if preemption_costs is None else preemption_costs,
        tiers=tiers,
        tier_config=config.serving.kv_tiers,
    )


def build_tier_links(env: simpy.Environment, config: SimConfig,
                     tiers: list[PrefixTier] | None, host_link: HostLink) -> TierLinks | None:
    """The links to an instance's tiers (None without tiers); the host tier shares
    `host_link`."""
    if tiers is None:
        return None
    return TierLinks(env, tiers, config.tier_links(), page_bytes=config.page_bytes,
                     host_link=host_link, overlap=config.serving.kv_tiers.overlap,
                     num_layers=config.model_spec.num_layers)


def tier_stats(manager: KVCacheManager, tiers: list[PrefixTier] | None,
               tier_links: TierLinks | None, requests: Sequence[Request]) -> dict[str, Any]:
    """Per tier, flat keys for the summary: hit rates over the prompt tokens of the scheduled
    `requests`, pages, hits, stores, evictions, link time (none without tiers)."""
    if tiers is None or tier_links is None:
        return {}
    return tier_summary(tiers, manager.first_hit_pages, manager.page_size,
                        scheduled_prompt_tokens(requests), tier_links.busy_s)


def scheduled_prompt_tokens(requests: Sequence[Request]) -> int:
    """Prompt tokens of the requests scheduled at least once: what hit rates are shares of."""
    return sum(r.prompt_len for r in requests if r.first_scheduled_s is not None)
