"""The C tier store (policies/_tierstore.c) against the Python one (`DictStore` over LRU): the
same operations give the same pages, victims, lookups and eviction order, and both conserve
their pages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies.tiers import DictStore, new_store

try:
    from kvlab.policies._tierstore import TierStore as CTierStore
except ImportError:
    CTierStore = None

pytestmark = pytest.mark.skipif(CTierStore is None, reason="kvlab.policies._tierstore is not "
                                "built (no C compiler at install)")

# Keys as the manager's are: negative trace keys, token-id hashes up to 2**64, and a few small
# ones so that puts meet held keys and probes collide.
KEYS = st.one_of(st.integers(-40, 40), st.integers(-(2**63), 2**64 - 1))
OPS = st.lists(st.one_of(
    st.tuples(st.just("put_many"), st.lists(KEYS, max_size=8)),
    st.tuples(st.just("put_into_free"), st.lists(KEYS, max_size=8)),
    st.tuples(st.just("pin"), st.lists(st.integers(0, 63), max_size=8)),
    st.tuples(st.just("unpin"), st.none()),
    st.tuples(st.just("clear"), st.none()),
), max_size=60)


@given(num_pages=st.integers(1, 64), ops=OPS)
def test_the_c_store_does_what_the_python_store_does(num_pages, ops):
    python, c = DictStore("lru", num_pages), CTierStore(num_pages)
    pinned: list[int] = []
    pinned_keys: list = []
    seen: list = []
    for name, arg in ops:
        if name == "put_many":  # keys none held, no two alike
            keys = [key for key in dict.fromkeys(arg) if key not in python]
            assert python.put_many(list(keys)) == c.put_many(list(keys))
        elif name == "put_into_free":  # no two alike, room for all
            keys = list(dict.fromkeys(arg))[: num_pages - python.num_handed_out]
            assert python.put_into_free(list(keys)) == c.put_into_free(list(keys))
        elif name == "pin":
            pages = [page for page in dict.fromkeys(arg) if page < python.num_handed_out]
            key_of = {python.get(key): key for key in seen if key in python}
            taken = python.pin(pages)
            assert c.pin(pages) == taken
            pinned += [page for page, was in zip(pages, taken, strict=True) if was]
            pinned_keys += [key_of[page] for page, was in zip(pages, taken, strict=True) if was]
        elif name == "unpin":
            python.unpin(pinned, pinned_keys)
            c.unpin(pinned, pinned_keys)
            pinned, pinned_keys = [], []
        elif not pinned:  # clear
            python.clear()
            c.clear()
        if name.startswith("put"):
            seen += arg
        probe = [*seen[-40:], -41, 2**64 - 1]
        assert c.pages_of(probe) == python.pages_of(probe)
        assert c.holds_each(probe) == python.holds_each(probe)
        assert c.holds_any(probe) == python.holds_any(probe)
        assert [c.get(key) for key in probe] == [python.get(key) for key in probe]
        assert c.lru_pages() == python.lru_pages()
        assert sorted(c.keys()) == sorted(python.keys())
        assert (c.num_handed_out, c.num_cached) == (python.num_handed_out, python.num_cached)
        c.check()
        python.check()


def test_a_full_store_churns_through_many_puts_and_stays_whole():
    # many more puts than pages: the table fills with dummies and is rebuilt over and over
    c = CTierStore(100)
    c.put_into_free(list(range(100)))
    for start in range(100, 20_000, 37):
        keys = list(range(start, start + 37))
        stored, pages, victim_pages, victim_keys = c.put_many(keys)
        assert stored == keys and sorted(pages) == sorted(victim_pages)
        assert victim_keys == list(range(start - 100, start - 63))
    c.check()
    assert c.num_handed_out == c.num_cached == 100
    assert c.pages_of(list(range(19_903, 19_906))) == [c.get(k) for k in range(19_903, 19_906)]


def test_bad_arguments_are_errors_and_change_nothing():
    c = CTierStore(4)
    c.put_into_free([1, 2])
    with pytest.raises(TypeError, match="expected a list"):
        c.put_many((3,))
    with pytest.raises(TypeError):
        c.put_many([[3]])  # an unhashable key
    with pytest.raises(ValueError, match="free tier pages"):
        c.put_into_free([5, 6, 7])
    with pytest.raises(ValueError, match="holds no content"):
        c.pin([3])
    with pytest.raises(ValueError, match="not pinned"):
        c.unpin([0])
    with pytest.raises(ValueError, match="num_pages"):
        CTierStore(0)
    c.check()
    assert c.pages_of([1, 2, 3]) == [0, 1, None] and c.lru_pages() == [0, 1]


def test_lru_tiers_use_the_c_store_unless_told_not_to(monkeypatch):
    monkeypatch.delenv("KVLAB_TIER_STORE", raising=False)
    assert isinstance(new_store("lru", 8), CTierStore)
    assert isinstance(new_store("arc", 8), DictStore)
    monkeypatch.setenv("KVLAB_TIER_STORE", "python")
    assert isinstance(new_store("lru", 8), DictStore)
