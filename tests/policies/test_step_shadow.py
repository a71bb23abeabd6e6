"""The manager driven in steps (`StepWalk`): random orders of calls within a step, each step's
MemOps carried out together in their documented order (tier writes, swap-outs, copies,
swap-ins, tier loads) on a shadow of every level, under every policy combination, with and
without memory tiers. Catches a swap-out that reads a page before the step's copy fills it, a
host page reused while a swap-in still reads it, a page cached a step late, a tier handed a key
twice, and any order the manager neither makes safe nor refuses."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.policies import MemOps
from kvlab.policies.spec import parse_policy
from kvlab.policies.tiers import TiersConfig, TierSpec, build_tiers
from tests.policies.harness import Harness
from tests.policies.step_walk import StepWalk
from tests.policies.test_manager_properties import MAX_MODEL_LEN, new_request, spec_and_memory
from tests.policies.test_tiers_shadow import tier_configs

# no tiers, or one to three
KINDS = [[], [], ["host"], ["host", "ssd"], ["host", "ssd", "remote"]]


@st.composite
def stepped_walks(draw):
    spec, num_pages, host_pages = draw(spec_and_memory())
    block_size = parse_policy(spec).block_size
    config = draw(tier_configs(block_size, KINDS))
    if config.tiers and "eviction=none" in spec:
        spec = spec.replace("eviction=none", "eviction=lru")
    return spec, num_pages, host_pages, config, draw(st.integers(0, 2**32 - 1))


def walk(spec: str, num_pages: int, host_pages, config: TiersConfig, seed: int,
         num_steps: int) -> StepWalk:
    """`num_steps` random steps, each checked; then every sequence freed, in a last step."""
    block_size = parse_policy(spec).block_size
    tiers = build_tiers(config, page_size=block_size, page_bytes=1) if config.tiers else None
    harness = Harness(spec, num_pages, MAX_MODEL_LEN, host_pages, tiers=tiers,
                      tier_config=config)
    stepped = StepWalk(harness, random.Random(seed), new_request)
    for _ in range(num_steps):
        stepped.step()
    harness.manager.begin_step()
    for seq in list(harness.live.values()) + list(harness.swapped.values()):
        harness.free(seq)
    harness.manager.end_step(MemOps())
    harness.check()
    return stepped


@settings(max_examples=3 * settings.default.max_examples)
@given(workload=stepped_walks())
def test_every_order_within_a_step_keeps_each_sequence_in_its_own_pages(workload):
    spec, num_pages, host_pages, config, seed = workload
    stepped = walk(spec, num_pages, host_pages, config, seed, num_steps=60)
    usage = stepped.manager.usage()
    assert usage.num_used_pages == 0 and usage.num_host_used_pages == 0
    stepped.manager.check_tiers()


def test_a_free_deferred_by_a_tier_load_leaves_no_uncomputed_page_to_hit():
    # Found by the thorough profile: a request admitted with hits loaded from the host tier
    # and two new pages (registered: their tokens are known) was freed in the same step, its
    # release deferred to the step's end (the loads still write its pages), and a request of
    # the same prompt admitted after it in that step took the two pages, never computed, as
    # prefix hits. The free now takes them out of the cache at once.
    config = TiersConfig(tiers=(TierSpec(kind="host", size_pages=2, eviction="lru"),
                                TierSpec(kind="ssd", size_pages=1, eviction="lru")),
                         write_policy="write-back", store_threshold=0, overlap="none")
    spec = ("paged:block_size=1,block_sizing=fixed,eviction=lru,preemption=recompute,"
            "victim=last-arrived")
    walk(spec, 48, 8, config, 341982, num_steps=60)
