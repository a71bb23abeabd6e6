"""The heap eviction policies (fifo, lfu, cost) list their cached-free pages near the order
they evict them (`iter_pages`): the next victim first, what `cached=1` demotes first."""

from __future__ import annotations

import copy
import itertools

from hypothesis import example, given
from hypothesis import strategies as st

from kvlab.policies import registry

OPS = st.lists(st.tuples(st.sampled_from(["add", "remove", "hit", "pop"]), st.integers(0, 7),
                         st.integers(0, 3)), max_size=120)


def _played(name: str, ops: list) -> object:
    evictor = registry.get("eviction", name).factory()
    for op, page, depth in ops:
        if op == "add" and page not in evictor:
            evictor.add(page, depth, ("prefix", page))
        elif op == "remove" and page in evictor:
            evictor.remove(page)
        elif op == "hit":
            evictor.on_hit(page)
        elif op == "pop" and len(evictor):
            evictor.pop_victim()
    return evictor


@given(name=st.sampled_from(["fifo", "lfu", "cost"]), ops=OPS)
@example(name="fifo", ops=[("add", 1, 0), ("remove", 1, 0), ("add", 1, 0), ("add", 2, 0)])
@example(name="lfu", ops=[("hit", 1, 0), ("hit", 1, 0), ("add", 1, 0), ("add", 2, 0)])
@example(name="lfu", ops=[("add", 2, 0), ("remove", 2, 0), ("hit", 1, 0), ("add", 1, 0),
                          ("add", 0, 0)])
def test_iter_pages_lists_each_page_once_the_next_victim_first(name, ops):
    """(fifo keeps a page's number when it is cached again: two heap entries alike; lfu
    evicts the page cached last first where the other was hit more; a stale entry on top
    leaves two unordered siblings under it)"""
    evictor = _played(name, ops)
    listed = list(evictor.iter_pages())
    assert sorted(listed) == sorted(evictor.pages())  # each page once, none stale
    popped = copy.deepcopy(evictor)
    order = [popped.pop_victim()[0] for _ in range(len(popped))]
    assert listed[:1] == order[:1]
    # the k-th to pop lies within the first 2**k - 1 entries of a heap with no stale ones
    if len(evictor._heap._heap) == len(listed):
        for k, page in enumerate(order[:6], 1):
            assert page in itertools.islice(listed, 2 ** k - 1)
