"""ARC and segmented-LRU eviction: behaviour plain LRU lacks, and agreement with list-based
reference models over random operation sequences."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies.eviction.arc import ARCEviction
from kvlab.policies.eviction.lru import LRUEviction
from kvlab.policies.eviction.slru import SLRUEviction


def _reuse(policy, page: int, key) -> None:
    """A prefix hit takes the cached page back, and its sequence releases it again."""
    policy.remove(page)
    policy.on_hit(page)
    policy.add(page, depth=0, key=key)


# ---------------------------------------------------------------- behaviour


@pytest.mark.parametrize("policy", [LRUEviction(), ARCEviction(), SLRUEviction()],
                         ids=["lru", "arc", "slru"])
def test_a_reused_page_survives_a_scan_of_once_used_pages_but_not_under_lru(policy):
    for page in range(5):
        policy.add(page, depth=0, key=page)
    _reuse(policy, 0, 0)  # page 0's content is hit
    for page in range(5, 15):  # a scan: ten pages released once, after the hot one
        policy.add(page, depth=0, key=page)
    victims, _ = policy.pop_victims(6)
    assert (0 in victims) == isinstance(policy, LRUEviction)


def test_arc_moves_p_toward_recency_on_b1_ghost_hits():
    arc = ARCEviction()
    for page in range(4):
        arc.add(page, depth=0, key=f"k{page}")
    assert arc.pop_victims(2) == ([0, 1], ["k0", "k1"])  # T1's LRU pages: ghosts in B1
    assert arc.ghost_keys() == (["k0", "k1"], [])
    arc.add(10, depth=0, key="k0")  # evicted content computed again and released
    assert arc.target_recent_pages == 1
    arc.add(11, depth=0, key="k1")
    assert arc.target_recent_pages == 2
    assert arc.num_ghost_hits_recent == 2
    assert arc.ghost_keys() == ([], [])
    assert (arc.num_recent_pages, arc.num_frequent_pages) == (2, 2)  # ghost hits go to T2
    # |T1| = 2 is no longer above p: the reused pages (T2) give up room first.
    assert arc.pop_victim() == (10, "k0")


def test_arc_moves_p_toward_frequency_on_b2_ghost_hits():
    arc = ARCEviction()
    for page in range(4):
        arc.add(page, depth=0, key=f"k{page}")
    arc.pop_victims(2)
    arc.add(10, depth=0, key="k0")
    arc.add(11, depth=0, key="k1")  # p = 2, T1 = [2, 3], T2 = [10, 11]
    assert arc.pop_victims(2) == ([10, 11], ["k0", "k1"])  # from T2: ghosts in B2
    assert arc.ghost_keys() == ([], ["k0", "k1"])
    arc.add(12, depth=0, key="k0")
    assert arc.target_recent_pages == 1
    assert arc.num_ghost_hits_frequent == 1
    assert arc.pop_victim() == (2, "k2")  # |T1| = 2 > p: once-used pages go first again


def test_arc_bounds_each_ghost_list_by_the_pool_size():
    arc = ARCEviction(num_total_pages=3)
    for round_ in range(5):
        arc.add(0, depth=0, key=round_)
        arc.pop_victim()
    assert arc.ghost_keys() == ([2, 3, 4], [])


def test_arc_learns_the_pool_size_from_page_ids():
    arc = ARCEviction()
    arc.add(4, depth=0, key="a")  # the pool has at least 5 pages
    for round_ in range(8):
        arc.add(0, depth=0, key=round_)
        arc.pop_victim()
    assert len(arc.ghost_keys()[0]) == 5


def test_slru_protected_segment_holds_its_share_of_the_cached_pages():
    slru = SLRUEviction()  # 80%
    for page in range(10):
        slru.add(page, depth=0, key=page)
    for page in range(10):
        _reuse(slru, page, page)
        assert slru.num_protected_pages <= int(0.8 * len(slru))
    assert slru.segments() == ([0, 1], [2, 3, 4, 5, 6, 7, 8, 9])
    assert slru.num_demotions == 2


def test_slru_demotes_to_the_probationary_mru_end():
    slru = SLRUEviction(protected_share=0.5)
    for page in range(4):
        slru.add(page, depth=0, key=page)
    for page in range(3):  # hits on cached-free pages protect them at once
        slru.on_hit(page)
    assert slru.segments() == ([3, 0], [1, 2])  # 0 demoted behind the never-hit page
    victims, _ = slru.pop_victims(4)
    assert victims == [3, 0, 1, 2]  # LRU would give [0, 1, 2, 3]


def test_slru_protects_a_page_hit_while_held_when_it_is_released():
    slru = SLRUEviction()
    for page in range(5):
        slru.add(page, depth=0, key=page)
    slru.on_hit(7)  # a held page another sequence hit
    slru.add(7, depth=0, key=7)
    assert slru.segments() == ([0, 1, 2, 3, 4], [7])


@pytest.mark.parametrize("policy", [ARCEviction(), SLRUEviction()], ids=["arc", "slru"])
def test_refuses_what_it_does_not_hold(policy):
    policy.add(2, depth=0, key=-3)
    with pytest.raises(KeyError):
        policy.remove(5)
    policy.remove(2)
    with pytest.raises(KeyError):
        policy.remove(2)
    with pytest.raises(LookupError):
        policy.pop_victim()
    with pytest.raises(LookupError):
        policy.pop_victims(1)


# ---------------------------------------------------------------- reference models


class ReferenceARC:
    """ARC as the docstring of `ARCEviction` states it, on plain lists."""

    def __init__(self, num_total_pages: int | None) -> None:
        self.t1: list[tuple[int, object]] = []  # (page, key), LRU first
        self.t2: list[tuple[int, object]] = []
        self.b1: list[object] = []  # evicted keys, oldest first
        self.b2: list[object] = []
        self.reused: set[int] = set()
        self.p = 0.0
        self.fixed = num_total_pages is not None
        self.c = num_total_pages or 0

    def pages(self) -> list[int]:
        return [page for page, _ in self.t1 + self.t2]

    def add(self, page: int, key) -> None:
        if not self.fixed:
            self.c = max(self.c, page + 1)
        frequent = page in self.reused
        self.reused.discard(page)
        if key in self.b1:
            self.p = min(self.c, self.p + max(1, len(self.b2) / len(self.b1)))
            self.b1.remove(key)
            frequent = True
        elif key in self.b2:
            self.p = max(0, self.p - max(1, len(self.b1) / len(self.b2)))
            self.b2.remove(key)
            frequent = True
        (self.t2 if frequent else self.t1).append((page, key))

    def remove(self, page: int) -> None:
        for segment in (self.t1, self.t2):
            for entry in segment:
                if entry[0] == page:
                    segment.remove(entry)
                    return
        raise AssertionError(page)

    def on_hit(self, page: int) -> None:
        for segment in (self.t1, self.t2):
            for entry in segment:
                if entry[0] == page:
                    segment.remove(entry)
                    self.t2.append(entry)
                    return
        self.reused.add(page)

    def pop(self) -> tuple[int, object]:
        if self.t1 and (len(self.t1) > self.p or not self.t2):
            victim, ghosts, other = self.t1.pop(0), self.b1, self.b2
        else:
            victim, ghosts, other = self.t2.pop(0), self.b2, self.b1
        if victim[1] in other:
            other.remove(victim[1])
        ghosts.append(victim[1])
        if len(ghosts) > self.c:
            ghosts.pop(0)
        return victim


class ReferenceSLRU:
    """Segmented LRU as the docstring of `SLRUEviction` states it, on plain lists."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.probation: list[tuple[int, object]] = []
        self.protected: list[tuple[int, object]] = []
        self.reused: set[int] = set()

    def pages(self) -> list[int]:
        return [page for page, _ in self.probation + self.protected]

    def _demote(self) -> None:
        while len(self.protected) > int(self.share * (len(self.protected) + len(self.probation))):
            self.probation.append(self.protected.pop(0))

    def add(self, page: int, key) -> None:
        if page in self.reused:
            self.reused.discard(page)
            self.protected.append((page, key))
        else:
            self.probation.append((page, key))
        self._demote()

    def remove(self, page: int) -> None:
        for segment in (self.probation, self.protected):
            for entry in segment:
                if entry[0] == page:
                    segment.remove(entry)
                    self._demote()
                    return
        raise AssertionError(page)

    def on_hit(self, page: int) -> None:
        for segment in (self.probation, self.protected):
            for entry in segment:
                if entry[0] == page:
                    segment.remove(entry)
                    self.protected.append(entry)
                    self._demote()
                    return
        self.reused.add(page)

    def pop(self) -> tuple[int, object]:
        victim = self.probation.pop(0) if self.probation else self.protected.pop(0)
        self._demote()
        return victim


_NUM_PAGES = 6
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["fill", "fill", "release", "release", "release_many", "take_back",
                         "take_back", "hit_held", "hit_cached", "pop", "pop", "pop_many"]),
        st.integers(0, 63),
        st.integers(0, 63),
    ),
    min_size=40,
    max_size=200,
)
_POLICIES = st.one_of(
    st.tuples(st.just("arc"), st.sampled_from([None, 1, 2, 8])),
    st.tuples(st.just("slru"), st.sampled_from([0.0, 0.25, 0.5, 0.8, 1.0])),
)


def _make(kind: str, parameter):
    if kind == "arc":
        return ARCEviction(num_total_pages=parameter), ReferenceARC(parameter)
    return SLRUEviction(protected_share=parameter), ReferenceSLRU(parameter)


@given(policy=_POLICIES, ops=_OPS)
def test_agrees_with_the_reference_and_pops_every_page_once(policy, ops):
    """Pages move as in the manager: free -> held with content (`fill`, a key no other page
    holds) -> cached-free (`release`) -> held again (`take_back`: remove then on_hit) or
    evicted (`pop`) -> free. Every victim and the cached set agree with the reference."""
    evictor, model = _make(*policy)
    content: dict[int, int] = {}  # page -> key, for pages with content (held or cached)
    cached: set[int] = set()
    num_added = num_taken_back = num_popped = 0
    popped_at_end: list[int] = []

    def popped(pages: list[int]) -> None:
        nonlocal num_popped
        assert set(pages) <= cached, "a victim that was not cached-free"
        assert len(set(pages)) == len(pages)
        for page in pages:
            cached.discard(page)
            del content[page]
        num_popped += len(pages)

    evicted_keys: list[int] = []  # keys of dropped content, which may be computed again
    next_key = 0
    for op, i, j in ops:
        free = [p for p in range(_NUM_PAGES) if p not in content]
        held = sorted(content.keys() - cached)
        in_cache = sorted(cached)
        if op == "fill" and free:  # new content, or content the cache dropped earlier
            again = [k for k in evicted_keys if k not in content.values()]
            if again and j % 2:
                content[free[i % len(free)]] = again[j // 2 % len(again)]
            else:
                content[free[i % len(free)]] = next_key
                next_key += 1
        elif op == "release" and held:
            page = held[i % len(held)]
            evictor.add(page, depth=0, key=content[page])
            model.add(page, content[page])
            cached.add(page)
            num_added += 1
        elif op == "release_many" and held:
            pages = held[: i % len(held) + 1]
            evictor.add_pages(pages, [content[p] for p in pages])
            for p in pages:
                model.add(p, content[p])
            cached.update(pages)
            num_added += len(pages)
        elif op == "take_back" and in_cache:
            page = in_cache[i % len(in_cache)]
            evictor.remove(page)
            evictor.on_hit(page)
            model.remove(page)
            model.on_hit(page)
            cached.discard(page)
            num_taken_back += 1
        elif op == "hit_held" and held:
            evictor.on_hit(held[i % len(held)])
            model.on_hit(held[i % len(held)])
        elif op == "hit_cached" and in_cache:
            evictor.on_hit(in_cache[i % len(in_cache)])
            model.on_hit(in_cache[i % len(in_cache)])
        elif op == "pop" and cached:
            victim = evictor.pop_victim()
            assert victim == model.pop()
            evicted_keys.append(content[victim[0]])
            popped([victim[0]])
        elif op == "pop_many" and cached:
            count = i % len(cached) + 1
            pages, keys = evictor.pop_victims(count)
            assert list(zip(pages, keys, strict=True)) == [model.pop() for _ in range(count)]
            evicted_keys.extend(keys)
            popped(pages)
        assert evictor.pages() == model.pages()
        assert len(evictor) == len(cached)
        assert all((p in evictor) == (p in cached) for p in range(_NUM_PAGES))
    if cached:
        pages, _ = evictor.pop_victims(len(cached))
        popped_at_end = pages
        popped(pages)
    assert len(evictor) == 0
    assert num_added == num_taken_back + num_popped, "a cached page was lost or duplicated"
    assert len(popped_at_end) == len(set(popped_at_end))
