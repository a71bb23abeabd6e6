"""kvlab.heap: the collector's state inside and after the blocks that control it."""

import gc

import pytest

from kvlab.heap import frozen_heap, paused_gc


def test_frozen_heap_unfreezes_when_the_run_fails():
    with pytest.raises(RuntimeError), frozen_heap():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("a step failed")
    assert gc.get_freeze_count() == 0


def test_frozen_heap_nested_leaves_the_outer_freeze_to_thaw():
    with frozen_heap():
        outer = gc.get_freeze_count()
        with frozen_heap():  # a benchmark client beside a server thread that froze first
            pass
        assert gc.get_freeze_count() >= outer > 0  # the inner block thawed nothing
    assert gc.get_freeze_count() == 0


def test_the_bench_client_runs_on_a_frozen_heap(monkeypatch):
    from kvlab.bench import client

    seen = []

    def fake_run(coroutine):
        coroutine.close()
        seen.append(gc.get_freeze_count())
        return "ran"

    monkeypatch.setattr(client.asyncio, "run", fake_run)
    config = client.ClientConfig(base_url="http://127.0.0.1:9", model="m")
    assert client.run_client(config, []) == "ran"
    assert seen[0] > 0 and gc.get_freeze_count() == 0


def test_paused_gc_disables_collection_inside_and_restores_it_after_a_failure():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # reentrant: the inner block leaves it off
            pass
        assert not gc.isenabled()
        raise RuntimeError("a step failed")
    assert gc.isenabled()


def test_paused_gc_leaves_a_collector_disabled_by_the_caller_disabled():
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_what_a_paused_block_keeps_joins_the_oldest_generation_unvisited():
    gc.collect()
    with paused_gc():
        kept = [[] for _ in range(5000)]  # more than a young collection's threshold
    assert gc.get_count()[0] < 100  # no young collection pending over the 5000
    oldest = {id(obj) for obj in gc.get_objects(generation=2)}
    assert id(kept[0]) in oldest and id(kept) in oldest


def test_paused_gc_leaves_frozen_objects_frozen():
    with frozen_heap():
        frozen = gc.get_freeze_count()
        with paused_gc():
            kept = [[] for _ in range(100)]
        # A frozen object that dies meanwhile leaves the count (two did during one full run of
        # the suite, the collector off); thawing them all would leave none frozen.
        assert frozen // 2 < gc.get_freeze_count() <= frozen
        assert kept
