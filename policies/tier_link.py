"""The manager's side of the memory tiers: what it stores below the device, looks up there and
pins for a step (the tiers themselves are `policies/tiers/`)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain, compress
from typing import TYPE_CHECKING, cast

from kvlab.policies.outputs import MemOps, TierBatch
from kvlab.policies.tiers import (
    PrefixTier,
    TierRuns,
    TiersConfig,
    TierStats,
    chain_length,
    tier_chain,
)
from kvlab.policies.tiers.units import DeviceUnits, UnitSlots, each_page, whole

if TYPE_CHECKING:
    from kvlab.policies.page_pool import PagePool


class TierLink:
    """Tiers below the device as the manager uses them: look up a chain of pages, pin hits for
    the step that loads them, store pages the device drops (write-back) or registers
    (write-through), and hand the step's writes over at its end.

    A tier page holds `unit` device pages (`kv_tier_block_size`): tier page p is slots
    p * unit onwards of the tier's memory (executors copy device pages); a unit of several
    pages is written whole: through, as its last page is computed (and never back: its pages
    leave the device one by one), or back, as its last page leaves the device
    (`policies/tiers/units.py`).

    `write_through` tells the block tables to report the pages they register
    (`queue_through`): true under write-through, and for units of several pages under
    write-back too (to know each unit's pages when it is written back).
    """

    __slots__ = (
        "_pool",
        "_reuse",
        "_through",
        "_through_keys",
        "_through_pages",
        "_tier_writes",
        "_units",
        "_write_backs",
        "first_hit_pages",
        "last_hit_levels",
        "page_size",
        "store_threshold",
        "tier_stats",
        "tiers",
        "unit",
        "write_through",
    )

    def __init__(self, tiers: list[PrefixTier], config: TiersConfig, pool: PagePool,
                 page_size: int) -> None:
        self.tiers = tiers
        self._pool = pool
        self.page_size = page_size
        self._through = config.write_policy == "write-through"
        self.store_threshold = config.store_threshold
        self.unit = config.block_pages(page_size)
        assert all(tier.block_pages == self.unit for tier in tiers), \
            "tiers built for another kv_tier_block_size"
        self.write_through = self._through or self.unit > 1
        # units of several pages written back: each unit's pages, from its registration
        self._units = DeviceUnits(self.unit) \
            if self.unit > 1 and not self._through else None
        if self.unit == 1 or not self._through:  # (units written through: never back)
            pool.on_evicted = self.write_back
        self._tier_writes: list[TierBatch] = []  # this step's, in order
        # Device pages evicted since the last write-back, with their keys: stored in batches
        # (before the next tier lookup, and at the end of the step).
        self._write_backs: tuple[list[int], list] = ([], [])
        # device pages registered this step, and their keys: written through next step (in
        # whole units: the unit's key is its last page's)
        self._through_pages: list[int] = []
        self._through_keys: list = []
        self._reuse: dict[Hashable, int] = {}  # key -> prefix hits on it (store_threshold > 0)
        # pages a new sequence's allocation hit, per level (device, then each tier), and their
        # sums over requests' first admissions (`count_first_hits`)
        self.last_hit_levels: list[int] = []
        self.first_hit_pages: list[int] = [0] * (1 + len(tiers))
        # what this manager did in each tier: all of a tier's counters, but for a pool that a
        # cluster's managers share (whose own `stats` are the pool's, all instances together)
        self.tier_stats: list[TierStats] = [TierStats() for _ in tiers]

    @property
    def has_through(self) -> bool:
        """Pages wait to be written through (the decode run-ahead must stop for them)."""
        return bool(self._through_keys)

    @property
    def epoch(self) -> int:
        """Counts content that left any tier (a lookup from another epoch is stale)."""
        return sum(tier.epoch for tier in self.tiers)

    # ----------------------------------------------------------------------------- lookups

    def chain(self, hashes: list, start: int, limit: int) -> TierRuns:
        """The tier slots of the pages from `start` (the first the device lacks) that the
        tiers hold, in a chain up to `limit`, as runs (level, slots) (`tier_chain`): by units
        of several pages, the whole units before `limit` (a unit's key is its last page's),
        but for the pages the device holds of the first. Pending write-backs are stored first:
        content evicted this step is found below."""
        self.flush_write_backs()
        stores, unit = [tier.store for tier in self.tiers], self.unit
        if unit == 1:
            return tier_chain(stores, hashes[start:limit])
        first = start // unit * unit
        units = tier_chain(stores, hashes[first + unit - 1 : limit // unit * unit : unit])
        runs: TierRuns = [(level, UnitSlots(pages, unit)) for level, pages in units]
        if runs and start > first:  # the device holds the first unit's first pages
            runs[0] = (runs[0][0], runs[0][1][start - first :])
        return runs

    def count_hits(self, hashes: list, num_device: int,
                   below: TierRuns) -> None:
        """A new sequence took `num_device` device hits and `below` tier hits: count them per
        level, and (store_threshold) each key's reuse."""
        levels = [num_device, *([0] * len(self.tiers))]
        for level, slots in below:
            levels[level] += len(slots)
        hit = hashes[: num_device + chain_length(below)] if self.store_threshold else []
        self.count_group_hits(hit, levels)

    def locate(self, key: Hashable) -> tuple[int, int]:
        """The level (1: the first tier) and page of the highest tier holding `key`."""
        for level, tier in enumerate(self.tiers, 1):
            page = tier.page_of(key)
            if page is not None:
                return level, page
        raise KeyError(key)

    def count_group_hits(self, keys: list, levels: list[int]) -> None:
        """A new sequence took hits on `keys` (every group's, on the device and below, where
        the model has KV-cache groups), `levels` pages of its (first) group's hit per level,
        device first: keep the levels for `count_first_hits`, and (store_threshold) count each
        key's reuse."""
        if self.store_threshold:
            reuse = self._reuse
            for key in keys:
                reuse[key] = reuse.get(key, 0) + 1
        self.last_hit_levels = levels

    def count_first_hits(self) -> None:
        """The sequence just allocated is at its first admission: add its hits, level by
        level, to `first_hit_pages`."""
        for level, pages in enumerate(self.last_hit_levels):
            self.first_hit_pages[level] += pages
        self.last_hit_levels = []

    def pin(self, hashes: list, start: int, hits: TierRuns) -> None:
        """Pin the tier pages of a sequence's hits below the device (runs of tier slots), its
        pages `start` onwards (a unit of several pages: pinned, and counted, whole)."""
        unit = self.unit
        for level, slots in hits:
            if unit == 1:
                pages, keys = list(slots), hashes[start : start + len(slots)]
            else:  # a unit where the run starts, then every `unit` slots; its key its last page's
                firsts = [0, *range(unit - slots[0] % unit, len(slots), unit)]
                keys = [hashes[(start + offset) // unit * unit + unit - 1] for offset in firsts]
                pages = [slots[offset] // unit for offset in firsts]
            self.tiers[level - 1].pin_many(pages, keys)
            self.tier_stats[level - 1].num_hits += len(pages) * unit
            start += len(slots)

    @staticmethod
    def loads(hits: TierRuns, pages: list[int]) -> list[TierBatch]:
        """The loads of hits below the device (runs of tier slots) into device `pages`."""
        return [TierBatch(level, sources, 0, destinations)
                for level, (sources, destinations) in _by_level(hits, pages).items()]

    # ----------------------------------------------------------------------------- steps

    def begin_step(self) -> None:
        """Write through the pages registered by the step before (their KV is computed now),
        unless their content left the device since (a unit of several pages: unless any of
        its pages' did), each key once (two tables may register one key in a step: the first
        freed before computing it, the second given the same pages)."""
        if not self._through_keys:
            return
        pages, keys = self._through_pages, self._through_keys
        self._through_pages, self._through_keys = [], []
        unit = self.unit
        found = list(map(self._pool.cached.get, keys))
        if found != pages:  # some content left the device (the common case: none did)
            live = whole([page == held for page, held in zip(pages, found, strict=True)], unit)
            pages, keys = list(compress(pages, live)), list(compress(keys, live))
        unit_keys = keys[unit - 1 :: unit]
        if len(set(unit_keys)) < len(unit_keys):
            first: dict = {}  # key -> the index of its first unit
            for index, key in enumerate(unit_keys):
                first.setdefault(key, index)
            keep = [first[key] == index for index, key in enumerate(unit_keys)]
            pages = list(compress(pages, each_page(keep, unit)))
            unit_keys = list(compress(unit_keys, keep))
        if unit_keys:
            self._store(0, pages, unit_keys, 1)

    def end_step(self, ops: MemOps) -> None:
        """Append the step's tier writes to `ops`, in the order they were decided, and release
        the tier pages its loads read."""
        self.flush_write_backs()
        if self._tier_writes:
            ops.tier_writes.extend(self._tier_writes)
            self._tier_writes = []
        for tier in self.tiers:
            tier.unpin_all()

    def forget(self) -> None:
        """Clear every tier and what waits to be written (the prefix cache was reset)."""
        for tier in self.tiers:
            tier.clear()
        self._through_pages, self._through_keys = [], []
        if self._units is not None:
            self._units.clear()

    def check(self, *, distinct: bool = True) -> None:
        """Conservation in every tier (AssertionError otherwise); nothing pinned between steps.
        `distinct`: also that no two keys share a tier page (`PrefixTier.check`)."""
        for tier in self.tiers:
            tier.check(distinct=distinct)
            assert not tier.num_pinned_pages, f"{tier.kind} tier pages left pinned"

    # ----------------------------------------------------------------------------- stores

    def write_back(self, pages: list[int], keys: list) -> None:
        """Device pages whose content is being dropped: store what the first tier lacks (in a
        batch, soon: the pages keep their content until the step's work runs)."""
        if self._units is not None:  # (units: each taken whole, or not, as it is evicted)
            self._units.evicted(pages, keys, self._pool.cached)
            return
        pending_pages, pending_keys = self._write_backs
        pending_pages.extend(pages)
        pending_keys.extend(keys)

    def flush_write_backs(self) -> None:
        """Store the pending write-backs now (units of several pages: those whose last page
        was evicted, whole: `DeviceUnits`)."""
        if self._units is not None:
            pages, keys = self._units.take_pending()
            if keys:
                self._store(0, pages, keys, 1, backward=True)
            return
        pages, keys = self._write_backs
        if pages:
            self._write_backs = ([], [])
            if len(set(keys)) < len(keys):  # evicted, cached again and evicted again since
                first: dict = {}  # key -> the page of its first eviction, in order
                for key, page in zip(keys, pages, strict=True):
                    first.setdefault(key, page)
                keys, pages = list(first), list(first.values())
            self._store(0, pages, keys, 1)

    def queue_through(self, pages: list[int], hashes: list, new: range | list[int],
                      start: int, num_full: int, regular: bool) -> None:
        """Queue for writing through the pages just registered (`new`, indices of a block
        table's pages `start` to `num_full`, with the table's `hashes`): with units of several
        pages, each unit whose last page is among them (so a unit is queued once, by the table
        registering its key), from the device pages holding its content (a unit whose pages
        are not all on the device is not written). `regular`: the table's pages hold its
        registered content (none cached elsewhere). Units written back: remember each unit
        whose last page is among them (`DeviceUnits.note`)."""
        unit = self.unit
        if self._units is not None:
            self._units.note(pages, hashes, new, regular, self._pool.cached)
            return
        if unit == 1:
            self._through_pages += [pages[index] for index in new]
            self._through_keys += [hashes[index] for index in new]
            return
        first, end = start // unit * unit, num_full // unit * unit  # the units completed
        if first >= end:
            return
        cached = self._pool.cached
        if isinstance(new, range):  # every page new
            keys = hashes[first:end]
            held = pages[first:end] if regular else list(map(cached.get, keys))
        else:  # only units whose last page is new here: another table queued the others
            fresh = set(new)
            starts = [index for index in range(first, end, unit) if index + unit - 1 in fresh]
            keys = list(chain.from_iterable(hashes[index : index + unit] for index in starts))
            held = list(map(cached.get, keys))
        if None in held:
            complete = whole([page is not None for page in held], unit)
            keys, held = list(compress(keys, complete)), list(compress(held, complete))
        self._through_pages += cast("list[int]", held)
        self._through_keys += keys

    def _store(self, src_level: int, src_pages: Sequence[int], keys: list, level: int, *,
               backward: bool = False) -> None:
        """Write `keys` (held by `src_pages` of `src_level`, a unit of `unit` pages each, in
        order; `backward`: each unit's pages last one first) to tier `level`, skipping what it
        holds already (and, from the device, what was not hit often enough); the pages they
        take there, where they held other content, first move it to the next tier. A tier
        whose pages are all read by loads of this step skips the write."""
        tiers, unit = self.tiers, self.unit
        tier = tiers[level - 1]
        # Keys are unique here (one device page per key, one tier page per key); the common
        # case, none of them held below yet, is checked in C.
        own = self.tier_stats[level - 1]
        if src_level == 0 and self.store_threshold:
            threshold, reuse = self.store_threshold, self._reuse
            keep = [not held and reuse.get(key, 0) >= threshold
                    for key, held in zip(keys, tier.store.holds_each(keys), strict=True)]
            keys = list(compress(keys, keep))
            src_pages = list(compress(src_pages, each_page(keep, unit)))
        elif len(keys) <= tier.num_free_pages:  # room for all: found and stored in one pass
            stored_keys, pages = tier.put_into_free(keys)
            if stored_keys is not None:
                src_pages = list(compress(src_pages, each_page(stored_keys, unit)))
            own.num_stores += len(pages) * unit
            if pages:  # (a row of free pages: one range of slots)
                slots: Sequence[int] = pages if unit == 1 \
                    else UnitSlots(range(pages[0], pages[-1] + 1), unit, backward)
                self._tier_writes.append(TierBatch(src_level, src_pages, level, slots))
            return
        elif tier.store.holds_any(keys):
            keep = [not held for held in tier.store.holds_each(keys)]
            keys = list(compress(keys, keep))
            src_pages = list(compress(src_pages, each_page(keep, unit)))
        if not keys:
            return
        stored, pages, victim_pages, victim_keys = tier.put_many(keys)
        own.num_stores += len(stored) * unit
        own.num_evictions += len(victim_keys) * unit
        victim_slots = UnitSlots(victim_pages, unit) if unit > 1 else victim_pages
        if victim_keys and level < len(tiers):
            tier.stats.num_demotions += len(victim_keys) * unit
            own.num_demotions += len(victim_keys) * unit
            self._store(level, victim_slots, victim_keys, level + 1)
        sources = src_pages[len(src_pages) - len(stored) * unit :]  # put_many keeps the last
        slots = pages if unit == 1 else UnitSlots(pages, unit, backward)
        self._tier_writes.append(TierBatch(src_level, sources, level, slots))


def _by_level(hits: TierRuns, values: list) -> dict[int, tuple[list[int], list]]:
    """Tier hits as runs `(level, tier slots)`, with a value per slot, grouped by level:
    (tier slots, values), in order."""
    grouped: dict[int, tuple[list[int], list]] = {}
    start = 0
    for level, slots in hits:
        level_slots, level_values = grouped.setdefault(level, ([], []))
        level_slots.extend(slots)
        level_values.extend(values[start : start + len(slots)])
        start += len(slots)
    assert start == len(values), "one value per hit"
    return grouped
