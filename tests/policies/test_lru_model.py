"""LRU eviction against a plain model (an OrderedDict of cached-free pages), over random
operations: stale queue entries left by prefix hits (one by one or in a batch) must never
surface as victims, and a recycled victim is the most recently used with its new key."""

from __future__ import annotations

from collections import OrderedDict
from unittest import mock

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvlab.policies.eviction import lru as lru_module
from kvlab.policies.eviction.lfu import LFUEviction
from kvlab.policies.eviction.lru import LRUEviction
from kvlab.policies.interfaces import recycle, take_hits

_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "add_run", "remove", "pop", "pop_many", "take",
                               "recycle"]),
              st.integers(0, 2)),
    max_size=80,
)


@given(ops=_OPS, compact_early=st.booleans())
# A page taken back twice leaves two stale entries ahead of its live one.
@example(
    ops=[("add", 0), ("remove", 0), ("add", 0), ("remove", 0), ("add", 1), ("add", 0)]
    + [("pop", 0)] * 2,
    compact_early=False,
)
def test_lru_matches_an_ordered_dict(ops, compact_early):
    # compact_early: drop the queue's consumed head after 2 entries, not thousands
    with mock.patch.object(lru_module, "_MIN_COMPACT", 2 if compact_early else 4096):
        _check_against_model(ops)


def _check_against_model(ops) -> None:
    lru, model = LRUEviction(), OrderedDict()  # model: page -> key, least recent first
    held = set(range(3))  # pages some sequence holds: they may be released (added)
    for step, (op, page) in enumerate(ops):
        if op == "add" and page in held:
            held.discard(page)
            lru.add_pages([page], [-step])  # a key per release: a stale entry's key differs
            model[page] = -step
        elif op == "add_run" and set(range(page + 1)) <= held:  # a tier's fresh pages: a range
            run = range(page + 1)
            held.difference_update(run)
            keys = [(-step, p) for p in run]
            lru.add_pages(run, keys)
            model.update(zip(run, keys, strict=True))
        elif op == "remove" and page in model:  # a prefix hit takes it back
            lru.remove(page)
            del model[page]
            held.add(page)
        elif op == "pop" and model:
            victim = lru.pop_victim()
            assert victim == model.popitem(last=False)
            held.add(victim[0])  # reused by a sequence
        elif op == "pop_many" and model:
            count = page % len(model) + 1
            expected = [model.popitem(last=False) for _ in range(count)]
            pages, keys = lru.pop_victims(count)
            assert list(zip(pages, keys, strict=True)) == expected
            held.update(pages)
        elif op == "recycle" and model:  # a full tier storing over its oldest pages
            count = page % len(model) + 1
            expected = [model.popitem(last=False) for _ in range(count)]
            new_keys = [(step, index) for index in range(count)]
            pages, keys = lru.recycle(count, new_keys)
            assert list(zip(pages, keys, strict=True)) == expected
            model.update(zip(pages, new_keys, strict=True))
        elif op == "take":  # a batch of hits (take_hits): pages 0..page, cached or not
            pages = list(range(page + 1))
            assert lru.take_hits(pages) == [p in model for p in pages]
            for p in pages:  # each was cached-free or held: now held
                model.pop(p, None)
                held.add(p)
        assert len(lru) == len(model)
        assert lru.pages() == list(model)
        assert all((p in lru) == (p in model) for p in range(4))


def test_lru_refuses_what_it_does_not_hold():
    lru = LRUEviction()
    lru.add(2, depth=0, key=-3)
    with pytest.raises(KeyError):
        lru.remove(5)
    lru.remove(2)
    with pytest.raises(KeyError):
        lru.remove(2)
    with pytest.raises(LookupError):
        lru.pop_victim()
    with pytest.raises(LookupError):
        lru.pop_victims(1)
    with pytest.raises(LookupError):
        lru.recycle(1, [-4])


def test_take_hits_without_a_batched_form_removes_and_counts_hits():
    """The interface helper on a policy without `take_hits` (one remove and on_hit each)."""
    lfu = LFUEviction()
    lfu.add(1, 0, "k1")
    lfu.add(2, 0, "k2")
    assert take_hits(lfu, [2, 3]) == [True, False]
    assert lfu.pages() == [1]


def test_recycle_without_a_batched_form_pops_then_adds():
    """The interface helper on a policy without `recycle`: the victims, then the same pages
    cached again with the new keys."""
    lfu = LFUEviction()
    lfu.add(1, 0, "k1")
    lfu.add(2, 0, "k2")
    lfu.on_hit(2)
    assert recycle(lfu, 1, ["k3"]) == ([1], ["k1"])
    assert sorted(lfu.pages()) == [1, 2] and len(lfu) == 2
