"""KV events: the manager's stored/removed events describe its prefix cache exactly (replaying
them gives the cache's keys after every operation), a stored block's key is the hash of its
token ids under its parent's key, and a reset empties the cache only when nothing is held."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies import KVCacheManager, Request
from kvlab.policies.kv_events import (
    CLEARED,
    REMOVED,
    STORED,
    KVEventLog,
    plain_group_of,
    split_key,
)
from kvlab.policies.request import hash_page
from tests.policies.harness import Harness
from tests.policies.test_manager_properties import run_walk, spec_and_memory


class EventReplay:
    """The set of cached keys the events describe, checked against the manager's."""

    def __init__(self) -> None:
        self.keys: set[int] = set()
        self.num_events = 0

    def __call__(self, h: Harness) -> None:
        manager = h.manager
        if manager.events is None:
            manager.events = KVEventLog()
        for event in manager.events.take():
            self.num_events += 1
            if event.kind == STORED:
                assert event.key not in self.keys, "stored twice without a removal"
                self.keys.add(event.key)
                if event.token_ids is not None:
                    assert hash_page(event.parent or 0, list(event.token_ids)) == event.key
            elif event.kind == REMOVED:
                assert event.key in self.keys, "removed a block never stored"
                self.keys.discard(event.key)
            else:
                assert event.kind == CLEARED
                self.keys.clear()
        assert self.keys == set(manager.pool.cached), "the events disagree with the prefix cache"


@given(memory=spec_and_memory(), seed=st.integers(0, 2**32 - 1))
def test_events_replay_to_the_prefix_cache(memory, seed):
    spec, num_pages, host_pages = memory
    replay = EventReplay()
    h = run_walk(spec, num_pages, host_pages, seed, num_ops=120, after_op=replay)
    for seq in list(h.live.values()) + list(h.swapped.values()):
        h.free(seq)
        replay(h)
    assert h.manager.reset_prefix_cache()
    replay(h)
    assert not replay.keys and h.manager.num_cached_free_pages == 0


def _request(request_id: int, ids: list[int], max_output: int = 4) -> Request:
    return Request(request_id, len(ids), max_output, arrival_s=0.0, prompt_token_ids=ids,
                   output_ids_known=True)


def test_stored_events_name_request_parent_and_tokens():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 16, max_model_len=64)
    manager.events = KVEventLog()
    seq = _request(0, list(range(10)))
    assert manager.allocate(seq, 10) is not None
    events = manager.events.take()
    assert [e.kind for e in events] == [STORED, STORED]
    first, second = events
    assert (first.request_id, first.parent, first.token_ids) == (0, None, (0, 1, 2, 3))
    assert (second.parent, second.token_ids) == (first.key, (4, 5, 6, 7))
    assert second.key == seq.page_hashes(4)[1]


def test_reset_refuses_while_a_sequence_holds_memory():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 16, max_model_len=64)
    manager.events = KVEventLog()
    seq = _request(0, list(range(8)))
    manager.allocate(seq, 8)
    manager.events.take()
    assert not manager.reset_prefix_cache() and manager.events.take() == []
    seq.num_computed_tokens = 8
    manager.free(seq)
    assert manager.num_cached_free_pages == 2
    assert manager.reset_prefix_cache()
    assert [e.kind for e in manager.events.take()] == [CLEARED]
    assert manager.num_cached_free_pages == 0 and manager.num_free_pages == 16
    assert manager.num_computed_prefix_tokens(_request(1, list(range(8)))) == 0


def test_no_event_log_no_events_recorded():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 16, max_model_len=64)
    assert manager.events is None
    manager.allocate(_request(0, list(range(8))), 8)  # runs without a log


def test_pages_registered_but_never_written_are_removed():
    """A request preempted in the step that registered its pages never computes them: their
    content leaves the cache, and a removed event says so."""
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 16, max_model_len=64)
    manager.events = KVEventLog()
    seq = _request(0, list(range(12)))
    manager.allocate(seq, 12)  # registers 3 pages for the tokens this step would compute
    stored = manager.events.take()
    seq.num_computed_tokens = 4  # ...but only the first page's were written
    manager.free(seq)
    removed = manager.events.take()
    assert [e.kind for e in removed] == [REMOVED, REMOVED]
    assert [e.key for e in removed] == [e.key for e in stored[1:]]
    assert set(manager.pool.cached) == {stored[0].key}


def _hybrid(layout: str, num_pages: int = 32) -> KVCacheManager:
    from kvlab.specs.kv_groups import parse_groups

    manager = KVCacheManager("paged:block_size=4,eviction=lru", num_pages, max_model_len=64,
                             groups=parse_groups(layout))
    manager.events = KVEventLog.for_manager(manager)
    return manager


def test_hybrid_events_name_each_block_group_with_its_page_hash():
    # vLLM's KV events carry group_idx and the block's own hash: the log splits the sliding
    # group's (group, hash) keys; the full group's plain keys are group 1 here
    manager = _hybrid("sliding_window(8),full")
    seq = _request(0, list(range(12)))
    assert manager.allocate(seq, 12) is not None
    events = manager.events.take()
    hashes = seq.page_hashes(4)
    assert sorted((e.group, e.key) for e in events) == sorted(
        (group, key) for group in (0, 1) for key in hashes)
    sliding = [e for e in events if e.group == 0]
    assert [e.parent for e in sliding] == [None, hashes[0], hashes[1]]
    assert all(type(e.key) is int for e in events)


def test_hybrid_removed_events_carry_the_group_of_the_evicted_key():
    manager = _hybrid("sliding_window(8),full", num_pages=8)
    first = _request(0, list(range(12)))
    manager.allocate(first, 12)
    first.num_computed_tokens = 12
    manager.free(first)  # six pages cached, two free
    manager.events.take()
    manager.allocate(_request(1, list(range(100, 112))), 12)  # evicts four of them
    removed = [e for e in manager.events.take() if e.kind == REMOVED]
    assert len(removed) == 4
    keys = {(group, key) for group in (0, 1) for key in first.page_hashes(4)}
    assert {(e.group, e.key) for e in removed} <= keys
    cached = {split_key(key, 1) for key in manager.pool.cached}
    assert cached & keys == keys - {(e.group, e.key) for e in removed}


def test_plain_group_is_the_first_full_attention_group():
    assert plain_group_of(["sliding_window", "full", "full"]) == 1
    assert plain_group_of(["sliding_window"]) == 0
    assert KVEventLog.for_manager(object()).plain_group == 0
    log = KVEventLog(plain_group=2)
    log.stored(7, 0, None, None)
    log.stored((1, 9), 0, (1, 7), None)
    log.removed([7, (1, 9)])
    assert [(e.kind, e.group, e.key, e.parent) for e in log.take()] == [
        (STORED, 2, 7, None), (STORED, 1, 9, 7), (REMOVED, 2, 7, None), (REMOVED, 1, 9, None)]
