"""The parts of one simulated instance that every simulation builds alike from its `SimConfig`
(its cost model, memory tiers, KV-cache manager and tier links, and its result with its tier
counters), for `Simulation` and for each instance of a `Cluster`: a setting added here reaches
both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from kvlab.errors import KvlabError
from kvlab.metrics import RunResult
from kvlab.policies import KVCacheManager, Request, StepLoop, registry
from kvlab.policies.precision.ladder import PrecisionLadder, build_ladder
from kvlab.policies.precision.summary import record_precision_mix
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.policies.tiers import PrefixTier, build_tiers, tier_summary
from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel, RooflineCostModel
from kvlab.sim.group_memory import GroupMemory
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
        page_bytes=config.page_bytes,  # (a hybrid model's pool page: one group's layers)
    )


def instance_tiers(config: SimConfig,
                   shared: dict[str, PrefixTier] | None = None) -> list[PrefixTier] | None:
    """The memory tiers of one instance of `config` (None without `kv_tiers`); a kind in
    `shared` (a cluster's remote pool) is that tier object, shared."""
    tier_config = config.serving.kv_tiers
    return build_tiers(tier_config, config.policy.block_size, config.page_bytes, shared) \
        if tier_config else None


def build_manager(config: SimConfig, cost_model: CostModel,
                  preemption_costs: PreemptionCosts | None = None,
                  tiers: list[PrefixTier] | None = None) -> KVCacheManager:
    """A fresh KV-cache manager of the config's policy and capacity over `tiers`;
    preemption=auto compares swap and recompute with `preemption_costs` (default:
    `cost_model`). A hybrid model's manager keeps one block table per KV-cache group
    (`SimConfig.kv_cache_groups`) and frees sliding-window pages per the retention interval."""
    num_pages = config.capacity.num_pages
    groups = config.kv_cache_groups
    hybrid: dict[str, Any] = {} if groups is None else {
        "groups": groups, "retention_interval": config.prefix_cache_retention_interval}
    return KVCacheManager(
        config.policy,
        num_pages,
        max_model_len=config.scheduler_config().max_model_len,
        num_host_pages=config.serving.num_host_pages(
            num_pages, config.serving.swap_space_bytes // config.page_bytes),
        costs=cost_model if preemption_costs is None else preemption_costs,
        tiers=tiers,
        tier_config=config.serving.kv_tiers,
        precision_ladder=precision_ladder(config),
        **hybrid,
    )


def precision_ladder(config: SimConfig) -> PrecisionLadder | None:
    """The levels the config's precision policy demotes through (None for `none`): the cache's
    dtype, then each next lower one (policies/precision/ladder.py)."""
    spec = config.policy
    if spec.precision == "none":
        return None
    policy = registry.get("precision", spec.precision).factory()
    model = config.model_spec
    if model.kv_lora_rank is not None:
        raise KvlabError(f"policy {spec}: precision demotion is not modelled for MLA latents "
                         f"({model.name})")
    return build_ladder(model.kv_cache_dtype, policy.depth, model.head_dim, model.dtype_bytes)


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
    return tier_summary(tiers, manager.tier_stats, manager.first_hit_pages, manager.page_size,
                        scheduled_prompt_tokens(requests), tier_links.busy_s)


def scheduled_prompt_tokens(requests: Sequence[Request]) -> int:
    """Prompt tokens of the requests scheduled at least once: what hit rates are shares of."""
    return sum(r.prompt_len for r in requests if r.first_scheduled_s is not None)


def instance_result(config: SimConfig, requests: Sequence[Request], loop: StepLoop,
                    tiers: list[PrefixTier] | None, tier_links: TierLinks | None,
                    metadata: dict[str, Any],
                    group_memory: GroupMemory | None = None) -> RunResult:
    """One instance's run: `requests`, its loop's steps and inter-token gaps, its memory, and
    `metadata` with its tier counters and, for a hybrid model, its pages per KV-cache group
    (`group_memory`)."""
    capacity, manager = config.capacity, loop.scheduler.manager
    if group_memory is not None:
        metadata = {**metadata, **group_memory.summary()}
    if manager.precision is not None:  # its mix: summary keys, and a column per level
        metadata = {**metadata, **record_precision_mix(manager.precision, loop.steps,
                                                       duration_s(requests))}
    return RunResult(
        requests=requests,
        steps=loop.steps,
        itls_s=np.frombuffer(loop.scheduler.itls_s, dtype=np.float64).copy(),
        duration_s=duration_s(requests),
        page_size=capacity.page_size,
        num_total_pages=capacity.num_pages,
        kv_cache_size_tokens=capacity.num_tokens,
        num_host_pages=manager.num_host_pages,
        metadata={**metadata, **tier_stats(manager, tiers, tier_links, requests)},
    )


def duration_s(requests: Sequence[Request]) -> float:
    """From the first arrival to the last finish (0 for an empty trace)."""
    if not requests:
        return 0.0
    first = min(r.arrival_s for r in requests)
    last = max(r.finish_s for r in requests if r.finish_s is not None)
    return float(last - first)


def progress_bar(total: int, *, enabled: bool, desc: str = "simulating") -> Any:
    """A tqdm bar of finished requests on stderr, labelled `desc` (None when not `enabled`)."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc=desc, leave=False)


def check_conservation(requests: Sequence[Request], manager: KVCacheManager) -> None:
    """Every request finished (or failed with a reason) and every page came back."""
    unfinished = [r.request_id for r in requests if not r.is_finished]
    assert not unfinished, f"requests {unfinished[:5]} never finished"
    unexplained = [r.request_id for r in requests if r.error is None and r.finish_s is None]
    assert not unexplained, f"requests {unexplained[:5]} ended without a stamp or a reason"
    # The tiers' page counts; the pass proving no two keys share a page is the tests' (it
    # costs about 2% of what a 131k-page tier adds to a run).
    manager.check_tiers(distinct=False)
    usage = manager.usage()
    assert usage.num_used_pages == 0, f"{usage.num_used_pages} pages still in use at the end"
    assert usage.num_host_used_pages == 0, f"{usage.num_host_used_pages} host pages still in use"
    assert usage.num_live_token_slots == 0, "live token slots left at the end"
