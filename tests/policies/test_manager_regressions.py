"""Regressions: each case a held-out check (or the shadow checker) found in the KV-cache manager.

Each fails on the manager before its fix (the second lookup test is the first one's other
side): a live page handed to a second request, a stale prefix lookup trusted, the prefix-hit
cap, buddy refusing requests that fit, decode pages never cached, pages cached whose KV a
preempted request never wrote.
"""
from __future__ import annotations

import pytest

from kvlab.policies import (
    ArrivalQueue,
    KVCacheManager,
    Request,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
)
from tests.policies.harness import compute


def _serve(manager: KVCacheManager, requests: list[Request], budget: int = 64) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=128)
    scheduler = Scheduler(config, manager)
    arrivals, now = ArrivalQueue(requests), 0.0
    for _ in range(10_000):
        arrivals.admit_until(now, scheduler)
        if not (scheduler.has_unfinished() or len(arrivals)):
            return scheduler
        output = scheduler.schedule(now)
        samples = [
            (r.num_output_tokens * 7 + 1) % 50 if r.output_ids_known else None
            for r in output.requests
        ]
        scheduler.update(output, samples, now)
        now += 1.0
    raise AssertionError("did not finish")


def test_a_hit_on_pages_of_two_tables_never_frees_a_page_still_held():
    # The held-out minimal case: Z's hit takes page 0 from X and page 1 from Y. When X and Z
    # finish, Y still holds Z's second hit page: it must stay used, not become cached-free.
    manager = KVCacheManager("paged:block_size=2,eviction=lru", 12, max_model_len=64)
    y = Request(1, 7, 4, prompt_token_ids=[1, 2, 3, 4, 5, 6, 7])
    x = Request(2, 3, 4, prompt_token_ids=[1, 2, 3])
    z = Request(3, 5, 4, prompt_token_ids=[1, 2, 3, 4, 5])
    compute(manager, y, 1)  # a first chunk: no full page yet
    compute(manager, x, 3)  # registers [1, 2]
    compute(manager, y, 4)  # [1, 2] is X's page; Y registers [3, 4]
    compute(manager, z, 1)
    assert z.num_computed_tokens == 5  # a hit of 4 tokens, from X's table and Y's
    manager.free(x)
    manager.free(z)
    held = manager.block_table(y)
    assert manager.usage().num_used_pages == len(held)
    # a request taking every free and cached page must not get one of Y's
    greedy = Request(4, 2 * (12 - len(held)), 1)
    compute(manager, greedy, greedy.prompt_len)
    assert not set(manager.block_table(greedy)) & set(held)


def test_allocate_refuses_a_lookup_whose_pages_were_evicted_since():
    manager = KVCacheManager("paged:block_size=2,eviction=lru", 6, max_model_len=64)
    first = Request(0, 5, 1, prompt_token_ids=[1, 2, 3, 4, 5])
    compute(manager, first, 5)
    manager.free(first)  # pages [1, 2] and [3, 4] stay cached
    again = Request(1, 6, 1, prompt_token_ids=[1, 2, 3, 4, 5, 6])
    again.num_computed_tokens = manager.num_computed_prefix_tokens(again)
    assert again.num_computed_tokens == 4
    other = Request(2, 12, 1, prompt_token_ids=list(range(20, 32)))
    compute(manager, other, 12)  # takes every page, evicting the cached ones
    with pytest.raises(ValueError, match="prefix cache holds 0 of its tokens"):
        manager.allocate(again, 2)
    assert manager.block_table(again) == []


def test_allocate_looks_up_again_when_another_lookup_came_between():
    manager = KVCacheManager("paged:block_size=2,eviction=lru", 8, max_model_len=64)
    first = Request(0, 5, 1, prompt_token_ids=[1, 2, 3, 4, 5])
    compute(manager, first, 5)
    manager.free(first)
    a = Request(1, 5, 1, prompt_token_ids=[1, 2, 3, 4, 9])
    b = Request(2, 3, 1, prompt_token_ids=[7, 7, 7])
    a.num_computed_tokens = manager.num_computed_prefix_tokens(a)
    manager.num_computed_prefix_tokens(b)
    assert manager.allocate(a, 1) is not None
    assert manager.block_table(a)[:2] == [0, 1]  # first's cached pages, found again


def test_a_recomputed_request_hits_its_own_output_pages():
    # vLLM caps a hit at num_tokens - 1 and caches decode blocks: after preemption by
    # recomputation a request finds its prompt and the full pages of its output
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 32, max_model_len=64)
    seq = Request(0, 8, 10, prompt_token_ids=list(range(8)), output_ids_known=True)
    compute(manager, seq, 8)
    for token in range(6):  # sample six outputs, computing each one's KV after it
        seq.output_token_ids.append(100 + token)
        seq.num_output_tokens += 1
        if token < 5:
            compute(manager, seq, 1)
    manager.free(seq)  # preempted: 13 of its 14 tokens computed
    seq.num_computed_tokens = 0
    assert manager.num_computed_prefix_tokens(seq) == 12  # prompt pages and one output page


def test_a_page_filled_during_decode_is_cached_in_the_step_that_fills_it():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 32, max_model_len=64)
    seq = Request(0, 6, 10, prompt_token_ids=list(range(6)), output_ids_known=True)
    compute(manager, seq, 6)
    seq.output_token_ids += [50, 51]
    seq.num_output_tokens = 2
    compute(manager, seq, 1)  # token 6
    reader = Request(1, 9, 1, prompt_token_ids=[*range(6), 50, 51, 60])
    assert manager.num_computed_prefix_tokens(reader) == 4
    compute(manager, seq, 1)  # token 7 fills page 1
    assert manager.num_computed_prefix_tokens(reader) == 8


def test_a_multi_turn_prompt_hits_the_previous_answer():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 64, max_model_len=128)
    first = Request(0, 10, 9, prompt_token_ids=list(range(10)), output_ids_known=True)
    _serve(manager, [first])
    # the next turn: the conversation so far, then a new question
    history = first.prompt_token_ids + first.output_token_ids
    second = Request(1, len(history) + 5, 4, arrival_s=100.0,
                     prompt_token_ids=[*history, 90, 91, 92, 93, 94], output_ids_known=True)
    _serve(manager, [second])
    # every page of the 18 tokens whose KV was computed (the last output never is)
    assert second.num_cached_tokens == 16


def test_pages_registered_by_a_chunk_that_never_ran_are_not_cached():
    # A request allocated in a step and then preempted in that step never computes the
    # chunk: the pages the chunk filled must not serve later prefix hits.
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 32, max_model_len=64)
    seq = Request(0, 8, 2, prompt_token_ids=list(range(8)))
    seq.num_computed_tokens = manager.num_computed_prefix_tokens(seq)
    assert manager.allocate(seq, 8) is not None  # scheduled, then preempted: nothing written
    manager.free(seq)
    twin = Request(1, 9, 2, prompt_token_ids=list(range(9)))
    assert manager.num_computed_prefix_tokens(twin) == 0


@pytest.mark.parametrize("sizing", ["fixed", "geometric", "predicted"])
def test_buddy_runs_every_request_that_fits_alone(sizing):
    # 74-token requests in 30 pages of 4: 19 pages each, though one power-of-two block for
    # the whole length (32 pages) would not fit
    manager = KVCacheManager(f"buddy:block_size=4,block_sizing={sizing}", 30, max_model_len=128)
    requests = [Request(i, 50, 24) for i in range(4)]
    assert manager.pages_needed_alone(requests[0]) == 19
    _serve(manager, requests)
    assert [r.status for r in requests] == [RequestStatus.FINISHED_LENGTH] * 4
    assert manager.usage().num_used_pages == 0


def test_buddy_alone_takes_a_prompt_whose_block_would_round_past_memory():
    # a 17-page prompt rounds up to a 32-page block; alone, it runs in power-of-two runs
    manager = KVCacheManager("buddy:block_size=1", 30, max_model_len=128)
    seq = Request(0, 17, 3)
    _serve(manager, [seq])
    assert seq.status is RequestStatus.FINISHED_LENGTH


def test_a_refusal_by_design_names_the_policy_rule():
    manager = KVCacheManager("contiguous:block_size=4,reserve=max", 30, max_model_len=128)
    seq = Request(0, 50, 24)
    _serve(manager, [seq])
    assert seq.status is RequestStatus.FINISHED_ERROR
    assert seq.error == (
        "request 0 needs 32 KV pages but the cache has only 30 (contiguous allocation with "
        "reserve=max reserves 128 tokens for this request of 74 tokens: 50 prompt + 24 output)"
    )
