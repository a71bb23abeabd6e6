"""Memory tiers under the scheduler, executed on the shadow of every level's pages: every tier
write and load carried out as an executor would, so a prefix hit served from a tier must bring
exactly the sequence's own content back (the shadow checks every hit's slots), and every
tier's pages are conserved after every step."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.policies import KVCacheManager, Request, RequestStatus
from kvlab.policies.spec import parse_policy
from kvlab.policies.tiers import TiersConfig, TierSpec, build_tiers
from tests.policies.harness import ShadowCost
from tests.policies.test_scheduler_shadow import MAX_MODEL_LEN, shadow_workloads
from tests.policies.test_scheduler_shadow import serve_on_shadow as serve_with_shadow

EVICTIONS = ["lru", "fifo", "lfu", "arc", "slru", "cost"]
TIER_KINDS = [["host"], ["host", "ssd"], ["remote"], ["host", "ssd", "remote"]]


@st.composite
def tier_configs(draw, block_size: int, kinds: list[list[str]] = TIER_KINDS) -> TiersConfig:
    """Tiers of one of the `kinds` lists, tier pages of one to four device pages of
    `block_size` tokens, every eviction policy, write policy and reuse threshold."""
    unit = draw(st.sampled_from([1, 1, 2, 3, 4]))  # device pages per tier page
    tiers = tuple(
        TierSpec(kind, size_pages=draw(st.integers(unit, 24)),
                 eviction=draw(st.sampled_from(EVICTIONS)))
        for kind in draw(st.sampled_from(kinds))
    )
    return TiersConfig(
        tiers,
        write_policy=draw(st.sampled_from(["write-back", "write-through"])),
        store_threshold=draw(st.sampled_from([0, 0, 1, 2])),
        block_size=None if unit == 1 else unit * block_size,
    )


@st.composite
def tiered_workloads(draw):
    spec, num_pages, config, requests = draw(shadow_workloads())
    if "eviction=none" in spec:
        spec = spec.replace("eviction=none", "eviction=lru")
    tier_config = draw(tier_configs(parse_policy(spec).block_size))
    return spec, num_pages, config, requests, tier_config


def serve_on_shadow(spec, num_pages, config, requests, tier_config):
    """Serve the requests to the end on a shadow executor, every tier checked after every
    step; returns the manager."""
    tiers = build_tiers(tier_config, page_size=parse_policy(spec).block_size, page_bytes=1)
    manager = KVCacheManager(spec, num_pages, max_model_len=MAX_MODEL_LEN, costs=ShadowCost(),
                             tiers=tiers, tier_config=tier_config)
    return serve_with_shadow(manager, config, requests, after_step=manager.check_tiers)


@settings(max_examples=3 * settings.default.max_examples)
@given(workload=tiered_workloads())
def test_tier_hits_bring_back_each_sequences_own_content(workload):
    spec, num_pages, config, requests, tier_config = workload
    manager = serve_on_shadow(spec, num_pages, config, requests, tier_config)
    for request in requests:
        fits = manager.pages_needed_alone(request) <= num_pages
        if request.total_len <= MAX_MODEL_LEN and fits:
            assert request.status is RequestStatus.FINISHED_LENGTH, request.error
    usage = manager.usage()
    assert usage.num_used_pages == 0 and usage.num_host_used_pages == 0
    manager.check_tiers()


def _repeated_prompts(num_requests: int, num_families: int, prompt_len: int) -> list[Request]:
    rng = random.Random(7)
    requests = []
    for request_id in range(num_requests):
        family = rng.randrange(num_families)
        ids = [family * 1000 + i for i in range(prompt_len)]
        requests.append(Request(request_id, prompt_len, 4, arrival_s=request_id * 1.0,
                                prompt_token_ids=ids))
    return requests


def _served(tier_config: TiersConfig) -> tuple[KVCacheManager, list[Request]]:
    from kvlab.policies import SchedulerConfig

    # Room on the device for about one prompt at a time: each other family's prompt evicts
    # most of it, so a repeat finds it mostly in the host tier.
    config = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256, max_model_len=64)
    requests = _repeated_prompts(40, 3, 32)
    manager = serve_on_shadow("paged:block_size=4,eviction=lru", 10, config, requests,
                              tier_config)
    return manager, requests


def test_a_prompt_evicted_from_the_device_is_served_from_the_host_tier():
    manager, requests = _served(TiersConfig((TierSpec("host", size_pages=64),)))
    host = manager.tiers[0]
    assert host.stats.num_hits > 0 and host.stats.num_stores > 0
    seen = set()
    for request in requests:
        family = request.prompt_token_ids[0]
        # a repeat hits every full page but the one holding the last prompt token
        assert request.num_cached_tokens == (28 if family in seen else 0)
        seen.add(family)
    assert host.stats.num_hits + manager.num_prefix_hits == 7 * (len(requests) - len(seen))


def test_without_the_tier_the_same_run_hits_far_less():
    _, requests = _served(TiersConfig((TierSpec("host", size_pages=64),)))
    without, requests_without = _served(TiersConfig())
    assert without.tiers is None
    cached = sum(r.num_cached_tokens for r in requests)
    assert sum(r.num_cached_tokens for r in requests_without) < cached / 2


def test_tier_pages_of_several_device_pages_are_written_back_whole():
    # units of two device pages, written as the device evicts them: a repeat finds its
    # prompt's whole units below the device (of the 7 full pages a hit may take, 3 whole
    # units), their content checked against the shadow of every page
    manager, requests = _served(TiersConfig((TierSpec("host", size_pages=64),),
                                            write_policy="write-back", block_size=8))
    host = manager.tiers[0]
    assert host.block_pages == 2 and host.stats.num_stores > 0 and host.stats.num_hits > 0
    seen = set()
    for request in requests:
        family = request.prompt_token_ids[0]
        # whole units from the tier, and the last page too where the device still holds it
        assert request.num_cached_tokens in ((24, 28) if family in seen else (0,))
        seen.add(family)
