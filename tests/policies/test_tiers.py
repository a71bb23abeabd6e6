"""Tier specs (the `--kv-tiers` grammar) and one tier's pages: put, evict, pin, conserve."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.policies.tiers import (
    PrefixTier,
    TiersConfig,
    TierSpec,
    TierStore,
    build_tiers,
    chain_head,
    chain_length,
    parse_tier,
    parse_tiers,
    tier_chain,
)
from kvlab.policies.tiers.units import UnitSlots, unit_slots


def test_the_grammar_reads_sizes_pages_and_options():
    host, ssd, remote = parse_tiers("host:512GiB, ssd:4TiB:eviction=arc:read=7:write=5,"
                                    "remote:1000p:latency=20")
    assert host == TierSpec("host", size_bytes=512 * 2**30)
    assert ssd.size_bytes == 4 * 2**40 and ssd.eviction == "arc"
    assert ssd.read_bandwidth == pytest.approx(7e9) and ssd.write_bandwidth == pytest.approx(5e9)
    assert remote.size_pages == 1000 and remote.latency_s == pytest.approx(20e-6)
    assert parse_tiers("") == () and parse_tiers("none") == ()
    assert parse_tiers("host:1GiB+ssd:2GiB") == parse_tiers("host:1GiB,ssd:2GiB")


@given(
    kind=st.sampled_from(["host", "ssd", "remote"]),
    size=st.integers(1, 2**45),
    pages=st.booleans(),
    eviction=st.sampled_from(["lru", "fifo", "lfu", "arc", "slru", "cost"]),
    read=st.none() | st.integers(1, 400).map(float),
)
def test_a_tier_round_trips_through_its_string(kind, size, pages, eviction, read):
    spec = TierSpec(kind, size_bytes=0 if pages else size, size_pages=size if pages else None,
                    eviction=eviction, read_bandwidth=None if read is None else read * 1e9)
    again = parse_tier(spec.to_string())
    assert again.to_string() == spec.to_string()
    assert again.kind == kind and again.eviction == eviction
    assert again.size_pages == spec.size_pages and again.size_bytes == spec.size_bytes


def test_the_config_round_trips_through_json():
    config = TiersConfig(parse_tiers("host:1GiB,ssd:10GiB:eviction=lfu"),
                         write_policy="write-through", store_threshold=2, overlap="layerwise")
    assert TiersConfig.from_json(config.to_json()) == config
    assert TiersConfig.from_json(None) == TiersConfig() and not TiersConfig()


@pytest.mark.parametrize("text, words", [
    ("disk:1GiB", "tier kind 'disk'"),
    ("host", "expected KIND:SIZE"),
    ("host:lots", "expected a size"),
    ("host:0", "expected > 0"),
    ("host:1GiB:eviction=none", "caches nothing"),
    ("host:1GiB:eviction=mru", "expected one of"),
    ("host:1GiB:speed=3", "unknown option 'speed'"),
    ("host:1GiB:read=fast", "is not a number"),
    ("host:1GiB:read=0", "expected a positive figure"),
])
def test_bad_tiers_say_what_was_expected(text, words):
    with pytest.raises(KvlabError, match=words) as caught:
        parse_tiers(text)
    assert caught.value.parameters == ("kv_tiers",)


def test_an_unknown_tier_eviction_lists_only_the_policies_a_tier_can_use():
    with pytest.raises(KvlabError) as caught:
        parse_tiers("host:1GiB:eviction=mru")
    offered = str(caught.value).rpartition("expected one of ")[2].split(", ")
    assert "lru" in offered and "arc" in offered and "none" not in offered


@pytest.mark.parametrize("settings, parameter", [
    ({"write_policy": "sometimes"}, "kv_tier_write"),
    ({"overlap": "always"}, "kv_tier_overlap"),
    ({"store_threshold": -1}, "kv_tier_store_threshold"),
])
def test_bad_write_settings_name_their_setting(settings, parameter):
    with pytest.raises(KvlabError) as caught:
        TiersConfig(**settings)
    assert caught.value.parameters == (parameter,)


@pytest.mark.parametrize("settings, page_size, words", [
    ({"block_size": 0}, 4, "kv_tier_block_size 0: expected a number of tokens >= 1"),
    ({"block_size": 6, "write_policy": "write-through"}, 4,
     "kv_tier_block_size 6: expected a multiple of the page size (4 tokens)"),
])
def test_bad_tier_page_sizes_say_what_was_expected(settings, page_size, words):
    with pytest.raises(KvlabError, match=re.escape(words)) as error:
        TiersConfig((TierSpec("host", size_pages=8),), **settings).block_pages(page_size)
    assert "kv_tier_block_size" in error.value.parameters


@pytest.mark.parametrize("write_policy", ["write-back", "write-through"])
def test_tier_pages_of_several_device_pages_divide_the_capacity(write_policy):
    config = TiersConfig(parse_tiers("host:10p"), write_policy=write_policy, block_size=12)
    assert config.block_pages(4) == 3 and TiersConfig().block_pages(4) == 1
    (host,) = build_tiers(config, page_size=4, page_bytes=1)
    assert (host.num_total_pages, host.block_pages) == (3, 3)  # 9 of the 10 pages' room
    with pytest.raises(KvlabError, match="holds no tier page of 3"):
        build_tiers(TiersConfig(parse_tiers("host:2p"), write_policy="write-through",
                                block_size=12), page_size=4, page_bytes=1)


def test_two_remote_pools_are_refused():
    with pytest.raises(KvlabError, match="one remote pool"):
        TiersConfig(parse_tiers("remote:1GiB,remote:2GiB"))


def test_capacity_in_pages_of_the_device():
    spec = TierSpec("host", size_bytes=10 * 2**20)
    assert spec.num_pages(2**20) == 10
    with pytest.raises(KvlabError, match="holds no page"):
        spec.num_pages(2**30)


def test_a_full_tier_evicts_by_its_policy_and_pinned_pages_stay():
    tier = PrefixTier(TierSpec("host", size_pages=2), 2)
    assert tier.put_many(["a"]) == (["a"], [0], [], [])
    assert tier.put_many(["b"]) == (["b"], [1], [], [])
    tier.pin_many([tier.page_of("a")], ["a"])  # a load reads "a" this step: "b" is the only victim
    assert tier.put_many(["c"]) == (["c"], [1], [1], ["b"])
    tier.pin_many([tier.page_of("c")], ["c"])
    assert tier.put_many(["d"]) == ([], [], [], [])  # every page read this step: skipped
    tier.check()


def test_a_batch_larger_than_the_room_keeps_its_last_keys():
    tier = PrefixTier(TierSpec("host", size_pages=2), 2)
    tier.put_many(["a"])
    assert tier.put_many(["b", "c", "d"]) == (["c", "d"], [1, 0], [0], ["a"])
    tier.check()


def test_putting_into_free_pages_skips_the_keys_held_and_keeps_the_rest_in_a_row():
    tier = PrefixTier(TierSpec("host", size_pages=8), 8)
    tier.put_many(["a", "b"])
    assert tier.put_into_free(["c", "a", "d"]) == ([True, False, True], [2, 3])
    assert [tier.page_of(key) for key in "abcd"] == [0, 1, 2, 3]
    assert tier.put_into_free(["e"]) == (None, [4])
    assert tier.stats.num_stores == 5 and tier.num_free_pages == 3
    tier.check()


def test_pins_end_with_the_step_and_make_the_page_recent():
    tier = PrefixTier(TierSpec("host", size_pages=2), 2)
    tier.put_many(["a", "b"])
    tier.pin_many([tier.page_of("a")], ["a"])
    tier.unpin_all()
    assert tier.put_many(["c"]) == (["c"], [1], [1], ["b"])  # "a" read last: LRU keeps it
    assert tier.stats.num_hits == 1 and tier.stats.num_evictions == 1
    tier.check()


def test_a_shared_kind_is_the_same_object_for_every_instance():
    config = TiersConfig(parse_tiers("host:4p,remote:8p"))
    first = build_tiers(config, page_size=4, page_bytes=1)
    second = build_tiers(config, page_size=4, page_bytes=1, shared={"remote": first[1]})
    assert second[1] is first[1] and second[0] is not first[0]


# Tier stores of each eviction policy a tier may take.
STORES = pytest.mark.parametrize("new", [
    pytest.param(lambda num_pages, eviction=eviction: TierStore(eviction, num_pages), id=eviction)
    for eviction in ("lru", "arc")
])


def _pairs(chain):
    """A chain's runs as (level, page) pairs, key by key."""
    return [(level, page) for level, pages in chain for page in pages]


def _chain_key_by_key(stores, keys):
    chain = []
    for key in keys:
        level = next((level for level, held in enumerate(stores, 1) if key in held), None)
        if level is None:
            break
        chain.append((level, stores[level - 1].get(key)))
    return chain


def _stores(new, holders, num_tiers):
    """A store per tier; key i held by the tiers in holders[i], stored last key first (so
    that pages are not the keys)."""
    stores = []
    for level in range(1, num_tiers + 1):
        keys = [key for key, held in enumerate(holders) if level in held][::-1]
        store = new(max(1, len(keys)))
        store.put_into_free(keys)
        stores.append(store)
    return stores


@STORES
@given(holders=st.lists(st.sets(st.integers(1, 3), max_size=3), max_size=40),
       num_tiers=st.integers(1, 3))
def test_a_chain_takes_each_key_from_the_highest_tier_holding_it(new, holders, num_tiers):
    stores = _stores(new, holders, num_tiers)
    keys = list(range(len(holders)))
    chain = tier_chain(stores, keys)
    assert _pairs(chain) == _chain_key_by_key(stores, keys)
    assert all(pages for _, pages in chain), "an empty run"
    assert chain_length(chain) == len(_pairs(chain))
    for num_pages in range(len(keys) + 2):
        assert _pairs(chain_head(chain, num_pages)) == _pairs(chain)[:num_pages]


@STORES
@given(runs=st.lists(st.tuples(st.sets(st.integers(1, 3), max_size=3), st.integers(1, 150)),
                     max_size=6),
       num_tiers=st.integers(1, 3))
def test_a_chain_of_long_runs_takes_each_key_from_the_highest_tier_holding_it(new, runs,
                                                                            num_tiers):
    # runs of up to 150 keys held by the same tiers (a prompt's pages move together), where
    # the test above draws each key's holders alone
    holders = [held for held, length in runs for _ in range(length)]
    stores = _stores(new, holders, num_tiers)
    keys = list(range(len(holders)))
    assert _pairs(tier_chain(stores, keys)) == _chain_key_by_key(stores, keys)


@given(st.lists(st.integers(0, 50), max_size=6), st.integers(1, 4), st.booleans(), st.data())
def test_unit_slots_read_as_the_slots_they_stand_for(tier_pages, unit, backward, data):
    slots = UnitSlots(tier_pages, unit, backward)
    rows = [list(range(page * unit, (page + 1) * unit)) for page in tier_pages]
    listed = [slot for row in rows for slot in (row[::-1] if backward else row)]
    assert backward or listed == unit_slots(tier_pages, unit)
    assert len(slots) == len(listed) and list(slots) == listed and slots == listed
    if listed:
        index = data.draw(st.integers(-len(listed), len(listed) - 1))
        assert slots[index] == listed[index]
    start = data.draw(st.integers(0, len(listed)))
    stop = data.draw(st.integers(start, len(listed)))
    assert list(slots[start:stop]) == listed[start:stop]
    with pytest.raises(IndexError):
        slots[len(listed)]
