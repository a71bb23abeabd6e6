"""Tier pages of several device pages (`kv_tier_block_size`): flags and slots per unit, and the
units the device holds, for writing one back whole as its last page leaves the device.

A unit is `unit` consecutive device pages of a block table, named by its last page's prefix
key. The device releases a finished sequence's pages tail first, so under LRU (and any order
that keeps a prefix's pages at least as long as the deeper ones) a unit's last page leaves the
device first, while the others are still cached there or leave in the same batch: `DeviceUnits`
remembers each unit's place in its table when the table registers it, and hands over the whole
unit when the device evicts that last page and every other page of the unit's content is still
on the device (a finished table's units, leaving together, a row at a time).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from itertools import chain, compress, count, islice, repeat
from operator import eq, itemgetter
from typing import cast, overload

_NO_ENTRY = (None, -1, -1)  # (a unit not registered: its last page is no page)
_LAST_PAGE = itemgetter(2)  # an entry's page holding the unit's last page


class DeviceUnits:
    """The units registered on the device: unit key -> (the registering table's prefix keys, the
    index of the unit's last page among them, the device page holding that page). A table's
    keys only ever grow, so the entry holds the list itself, not a copy of the unit's part.
    An entry leaves when its last page is evicted (`evicted`) or the prefix cache is reset
    (`clear`)."""

    __slots__ = ("_pending_keys", "_pending_pages", "_units", "unit")

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self._units: dict[Hashable, tuple[list, int, int]] = {}
        # units evicted whole since the last `take_pending`: their device pages, unit by unit,
        # each unit's last page first (as the device evicts them), and keys
        self._pending_pages: list[int] = []
        self._pending_keys: list = []

    def __len__(self) -> int:
        return len(self._units)

    def note(self, pages: list[int], hashes: list, new: range | list[int], regular: bool,
             cached: dict) -> None:
        """A table registered its pages at indices `new` (with its `pages` and `hashes`):
        remember each unit whose last page is among them (where not `regular`, some content
        was cached in other pages: only units whose content is all on the device)."""
        unit, units = self.unit, self._units
        if isinstance(new, range):
            lasts: range | list[int] = range(new.start + (-new.start - 1) % unit, new.stop, unit)
        else:
            lasts = [index for index in new if index % unit == unit - 1]
        if regular:  # (the usual case, in C loops)
            entries = zip(repeat(hashes), lasts, map(pages.__getitem__, lasts))
            units.update(zip(map(hashes.__getitem__, lasts), entries, strict=True))
            return
        for last in lasts:
            held = list(map(cached.get, hashes[last - unit + 1 : last + 1]))
            if None not in held:
                units[hashes[last]] = (hashes, last, cast("int", held[-1]))

    def evicted(self, pages: list[int], keys: list, cached: dict) -> None:
        """The device evicts `pages` holding `keys` now (in order; `cached` no longer holds
        them): keep for `take_pending` the units whose last page is among them and whose other
        pages' content is still on the device (cached, or evicted in this batch), in eviction
        order. Every evicted unit key's entry is dropped."""
        units, unit = self._units, self.unit
        if len(keys) == 1 and keys[0] not in units:  # (one page taken for another: no unit)
            return
        src_pages, unit_keys = self._pending_pages, self._pending_keys
        gone: dict | None = None  # key -> page of its first eviction in the batch, if needed
        index, num_keys = 0, len(keys)
        while True:  # (the next unit key found by a C scan: pages between units are many)
            index = next(compress(count(index), map(units.__contains__, islice(keys, index, None))),
                         num_keys)
            if index == num_keys:
                break
            key = keys[index]
            entry = units[key]
            if entry[2] != pages[index]:  # registered again elsewhere since: not this content
                index += 1
                continue
            hashes, last = entry[0], entry[1]
            num_whole = self._take_run(pages, keys, index, hashes, last)
            if num_whole:
                index += num_whole * unit
                continue
            del units[key]
            first, num_here = last - unit + 1, num_keys - index
            if num_here < unit and _follows(keys, index, hashes, last, num_here):
                # a unit the batch's end cuts: its first pages still cached
                held = list(map(cached.get, hashes[first : last - num_here + 1]))
                if None not in held:
                    src_pages += pages[index:]
                    src_pages += cast("list[int]", held[::-1])
                    unit_keys.append(key)
                    break
            rest = hashes[first:last]
            held = list(map(cached.get, rest))
            if None in held:  # (not cached: evicted in this batch, or gone before)
                gone = gone or dict(zip(reversed(keys), reversed(pages), strict=True))
                held = [gone.get(k) if page is None else page
                        for k, page in zip(rest, held, strict=True)]
            if None not in held:  # (else some page of the unit left before its last one)
                src_pages.append(pages[index])
                src_pages += cast("list[int]", held[::-1])
                unit_keys.append(key)
            index += 1

    def _take_run(self, pages: list[int], keys: list, index: int, hashes: list,
                  last: int) -> int:
        """The whole units evicted in a row from `index` of the batch (`pages`, `keys`), as
        a table holding `hashes` registered them: the unit whose last page is `hashes[last]`
        (its entry's page checked) and those below it in the table whose pages follow, each
        taken where its entry is this content's. Returns how many units the row spans (0: the
        first unit is not whole here). A table's units leave the device together: one slice
        compared, not one per unit."""
        unit = self.unit
        num_units = min((len(keys) - index) // unit, (last + 1) // unit)
        if not _follows(keys, index, hashes, last, num_units * unit):
            low, high = 0, num_units  # (whole rows: `low` units do, `high` do not)
            while high - low > 1:
                middle = (low + high) // 2
                if _follows(keys, index, hashes, last, middle * unit):
                    low = middle
                else:
                    high = middle
            num_units = low
        if not num_units:
            return 0
        end = index + num_units * unit
        unit_keys = hashes[last : last - num_units * unit if last >= num_units * unit else None
                           : -unit]
        held_at = map(_LAST_PAGE, map(self._units.get, unit_keys, repeat(_NO_ENTRY)))
        taken = list(map(eq, held_at, pages[index:end:unit]))  # (its entry's page is this one)
        if False in taken:
            unit_keys = list(compress(unit_keys, taken))
            self._pending_pages.extend(chain.from_iterable(
                compress(_chunks(pages[index:end], unit), taken)))
        else:  # (the usual case)
            self._pending_pages += pages[index:end]
        deque(map(self._units.__delitem__, unit_keys), maxlen=0)
        self._pending_keys += unit_keys
        return num_units

    def take_pending(self) -> tuple[list[int], list]:
        """The units evicted whole since the last call, each key once (its first eviction):
        (their device pages, unit by unit, each unit's last page first, and the unit keys)."""
        pages, keys = self._pending_pages, self._pending_keys
        if not keys:
            return [], []
        self._pending_pages, self._pending_keys = [], []
        if len(set(keys)) < len(keys):  # evicted, registered again and evicted again since
            unit, first = self.unit, dict[Hashable, int]()
            for number, key in enumerate(keys):
                first.setdefault(key, number)
            keys = list(first)
            pages = [page for number in first.values()
                     for page in pages[number * unit : (number + 1) * unit]]
        return pages, keys

    def clear(self) -> None:
        """Forget every unit (the prefix cache was reset)."""
        self._units.clear()
        self._pending_pages, self._pending_keys = [], []


def _follows(keys: list, index: int, hashes: list, last: int, span: int) -> bool:
    """Whether `keys[index : index + span]` are `hashes` from `last` down, in that order."""
    return keys[index : index + span] == hashes[last : last - span if last >= span else None : -1]


def _chunks(values: list, size: int) -> zip:
    """Consecutive tuples of `size` of `values` (whose length is a multiple of it)."""
    return zip(*[iter(values)] * size, strict=True)


def each_page(flags: list[bool], unit: int) -> list[bool]:
    """A flag per unit as a flag per page, `unit` pages a unit."""
    if unit == 1:
        return flags
    return [flag for flag in flags for _ in range(unit)]


def whole(flags: list[bool], unit: int) -> list[bool]:
    """A flag per page, `unit` pages a unit: true where all of its unit's are."""
    if unit == 1:
        return flags
    return each_page([all(flags[start : start + unit])
                      for start in range(0, len(flags), unit)], unit)


class UnitSlots(Sequence[int]):
    """The device-page slots of tier pages of `unit` device pages each, in order, as
    `unit_slots` lists them but not listed: a tier write's simulator needs only their number,
    an executor iterates them. `backward`: each tier page's slots last one first (where the
    source pages come as the device evicts a unit's pages: `DeviceUnits`)."""

    __slots__ = ("backward", "pages", "unit")

    def __init__(self, tier_pages: Sequence[int], unit: int, backward: bool = False) -> None:
        self.pages = tier_pages
        self.unit = unit
        self.backward = backward

    def __len__(self) -> int:
        return len(self.pages) * self.unit

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        unit = self.unit
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and not start % unit and not stop % unit:  # whole tier pages
                return UnitSlots(self.pages[start // unit : stop // unit], unit, self.backward)
            return list(self)[index]
        page, offset = divmod(index if index >= 0 else index + len(self), unit)
        if not 0 <= page < len(self.pages):
            raise IndexError(index)
        return self.pages[page] * unit + (unit - 1 - offset if self.backward else offset)

    def __iter__(self) -> Iterator[int]:
        if not self.backward:
            return iter(unit_slots(self.pages, self.unit))
        unit = self.unit
        lasts = [page * unit + unit - 1 for page in self.pages]
        return chain.from_iterable(map(range, lasts, map((-unit).__add__, lasts), repeat(-1)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UnitSlots):
            return (self.unit, self.backward, list(self.pages)) \
                == (other.unit, other.backward, list(other.pages))
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # (mutable, as the lists it stands for)

    def __repr__(self) -> str:
        return f"UnitSlots({self.pages!r}, unit={self.unit}, backward={self.backward})"


def unit_slots(tier_pages: Sequence[int], unit: int) -> list[int]:
    """The device-page slots of tier pages of `unit` device pages each, in order."""
    if unit == 1:
        return list(tier_pages)
    starts = [page * unit for page in tier_pages]  # then a range each, in C
    return list(chain.from_iterable(map(range, starts, map(unit.__add__, starts))))
