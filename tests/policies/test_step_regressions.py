"""Regressions of issue 54, each failing on the manager before its fix: pages filled by small
chunks cached a step late or never, a swap-out reading a page before its copy-on-write copy,
a tier handed one key twice by write-through, and orders within a step that the manager now
makes safe or refuses (`StepOrderError`)."""

from __future__ import annotations

import itertools

import pytest

from kvlab.policies import (
    KVCacheManager,
    MemOps,
    Request,
    Scheduler,
    SchedulerConfig,
    StepOrderError,
)
from kvlab.policies.kv_events import STORED, KVEventLog
from kvlab.policies.tiers import TiersConfig, TierSpec, build_tiers
from tests.policies.harness import compute
from tests.policies.shadow import ShadowMemory


def _serve_alone(manager: KVCacheManager, seq: Request, budget: int) -> list[list]:
    """Run one request to its end through a Scheduler; the KV events of each step."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=budget, max_model_len=256)
    scheduler = Scheduler(config, manager)
    manager.events = KVEventLog()
    scheduler.add_request(seq)
    steps = []
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        steps.append(manager.events.take())
        samples = [7 if r.output_ids_known else None for r in output.requests]
        scheduler.update(output, samples)
    return steps


# ------------------------------------------------------------------ 1: pages cached in time

def test_a_prompt_sent_again_hits_every_page_after_chunks_of_one_page():
    # page size 16, a budget of one page: each chunk fills one page by growing one page
    manager = KVCacheManager("paged:block_size=16,eviction=lru", 64, max_model_len=256)
    ids = list(range(65))
    _serve_alone(manager, Request(0, 65, 2, prompt_token_ids=ids),
                 budget=16)
    again = Request(1, 65, 2, prompt_token_ids=ids)
    assert manager.num_computed_prefix_tokens(again) == 64


@pytest.mark.parametrize(("page_size", "budget"), [(1, 3), (2, 2), (4, 4), (16, 16)])
def test_each_page_is_stored_in_the_step_that_fills_it(page_size, budget):
    manager = KVCacheManager(f"paged:block_size={page_size},eviction=lru", 256,
                             max_model_len=256)
    seq = Request(0, 37, 20, prompt_token_ids=list(range(37)), output_ids_known=True)
    steps = _serve_alone(manager, seq, budget)  # chunks of `budget` tokens, then decodes
    stored_in = [sum(event.kind == STORED for event in events) for events in steps]
    computed = [*range(budget, 37, budget), 37]  # the end of each step's tokens
    computed += range(38, 38 + len(steps) - len(computed))  # then one decode token a step
    filled = [end // page_size for end in computed]
    assert stored_in == [filled[0]] + [b - a for a, b in itertools.pairwise(filled)]


def test_a_small_chunk_that_fills_a_page_registers_it():
    # page size 16: a chunk of 16 tokens, one of 14, then tokens 30..31 fill page 1
    manager = KVCacheManager("paged:block_size=16,eviction=lru", 16, max_model_len=256)
    manager.events = KVEventLog()
    seq = Request(0, 40, 4, prompt_token_ids=list(range(40)))
    for chunk in (16, 14):
        compute(manager, seq, chunk)
    manager.events.take()
    compute(manager, seq, 2)
    assert [event.kind for event in manager.events.take()] == [STORED]
    twin = Request(1, 40, 4, prompt_token_ids=list(range(40)))
    assert manager.num_computed_prefix_tokens(twin) == 32


# ------------------------------------------------------------------ 2: copy-on-write, swap-out

def test_a_swap_out_after_a_copy_on_write_in_its_step_keeps_the_sequences_tokens():
    manager = KVCacheManager("paged:block_size=4,host_pages=8", 16, max_model_len=64)
    shadow = ShadowMemory(manager, lambda seq, index: ("token", index))
    parent = Request(0, 3, 20)
    ops = compute(manager, parent, 3)
    shadow.execute(ops)
    shadow.admitted(parent, 0)
    shadow.wrote(parent, 0, 3)
    step = MemOps()
    manager.begin_step()
    child = Request(1, 3, 20)
    child.num_computed_tokens = 3
    manager.fork(parent, child)  # they share the partly filled page
    shadow.forked(parent, child)
    step.extend(manager.allocate(parent, 12))  # copies it first
    assert step.copies
    assert manager.can_swap_out(parent)
    step.extend(manager.swap_out(parent))  # in the same step
    manager.end_step(step)
    shadow.swapped_out(parent, step.swap_outs, copies=step.copies)
    shadow.execute(step)  # swap-outs, then copies
    shadow.check()  # the host holds the parent's three tokens


# ------------------------------------------------------------------ 3: write-through, one key once

def test_write_through_stores_a_key_registered_twice_in_a_step_once():
    config = TiersConfig((TierSpec("host", size_pages=4),), write_policy="write-through")
    tiers = build_tiers(config, page_size=2, page_bytes=1)
    manager = KVCacheManager("paged:block_size=2,eviction=lru", 6, max_model_len=64,
                             tiers=tiers, tier_config=config)
    ids = list(range(20))
    a = Request(0, 16, 4, prompt_token_ids=ids[:16])
    manager.begin_step()
    compute(manager, a, 8)  # step 1: 4 pages
    manager.end_step(MemOps())
    manager.begin_step()  # step 2: the tier fills with them
    b = Request(1, 16, 4, prompt_token_ids=ids[:16])
    b.num_computed_tokens = 8
    manager.fork(a, b)
    manager.allocate(a, 4)  # registers pages 4 and 5, queued for write-through
    manager.free(a)  # freed before computing them
    assert manager.allocate(b, 4) is not None
    assert manager.block_table(b)[4:] == [4, 5]  # the same keys, in the same pages
    manager.end_step(MemOps())
    manager.begin_step()  # step 3: each key stored once
    ops = MemOps()
    manager.end_step(ops)
    manager.check_tiers()
    written = [page for batch in ops.tier_writes for page in batch.dst_pages]
    assert len(written) == len(set(written)) == 2


# ------------------------------------------------------------------ 4: orders within a step

def test_a_swap_out_after_a_swap_in_in_its_step_leaves_the_swap_ins_host_pages_alone():
    manager = KVCacheManager("paged:block_size=4,host_pages=2,preemption=swap", 16,
                             max_model_len=64)
    a, c = Request(0, 8, 4), Request(1, 8, 4)
    compute(manager, a, 8)
    compute(manager, c, 8)
    host_pages = [host for _, host in manager.swap_out(a).swap_outs]
    manager.begin_step()
    swap_in = manager.swap_in(a)
    assert swap_in is not None and [host for host, _ in swap_in.swap_ins] == host_pages
    assert not manager.can_swap_out(c)  # the host pages are read later in this step
    manager.end_step(MemOps())
    assert manager.can_swap_out(c)


def test_a_sequence_admitted_in_the_step_is_not_swapped_out_in_it():
    manager = KVCacheManager("paged:block_size=4,host_pages=8,preemption=swap", 16,
                             max_model_len=64)
    manager.begin_step()
    seq = Request(0, 8, 4)
    compute(manager, seq, 8)
    assert not manager.can_swap_out(seq)
    manager.end_step(MemOps())
    assert manager.can_swap_out(seq)


def test_releasing_the_owner_of_pages_hit_before_it_computed_them_is_refused():
    manager = KVCacheManager("paged:block_size=4,eviction=lru,host_pages=8", 16,
                             max_model_len=64)
    ids = list(range(12))
    owner = Request(0, 12, 4, prompt_token_ids=ids)
    reader = Request(1, 12, 4, prompt_token_ids=ids)
    compute(manager, owner, 4)  # page 0, computed
    manager.begin_step()
    assert manager.allocate(owner, 8) is not None  # registers pages 1 and 2, not computed yet
    compute(manager, reader, 4)  # hits pages 0 and 1 in the same step
    assert reader.num_computed_tokens == 12
    usage = manager.usage()
    assert manager.can_swap_out(owner)
    with pytest.raises(StepOrderError, match="request 0 is released"):
        manager.free(owner)
    with pytest.raises(StepOrderError, match="request 0 is released"):
        manager.swap_out(owner)
    assert manager.usage() == usage and len(manager.block_table(owner)) == 3  # nothing changed
    manager.end_step(MemOps())
    owner.num_computed_tokens = 12  # the step computed them: now it may go
    manager.free(owner)


def test_fork_of_a_parent_with_tokens_claimed_but_not_computed_is_refused():
    manager = KVCacheManager("paged:block_size=4", 16, max_model_len=64)
    parent = Request(0, 8, 4)
    assert manager.allocate(parent, 8) is not None
    with pytest.raises(StepOrderError, match="claimed 8 tokens and computed 0"):
        manager.fork(parent, Request(1, 8, 4))
