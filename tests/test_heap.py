"""kvlab.heap: the collector's state inside and after the blocks that control it."""

import gc

import pytest

from kvlab.heap import frozen_heap, paused_gc


def test_frozen_heap_unfreezes_when_the_run_fails():
    with pytest.raises(RuntimeError), frozen_heap():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("a step failed")
    assert gc.get_freeze_count() == 0


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
