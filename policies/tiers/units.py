"""Tier pages of several device pages (`kv_tier_block_size`): flags and slots per unit, and the
units the device holds, for writing one back whole as its last page leaves the device.

A unit is `unit` consecutive device pages of a block table, named by its last page's prefix
key. The device releases a finished sequence's pages tail first, so under LRU (and any order
that keeps a prefix's pages at least as long as the deeper ones) a unit's last page leaves the
device first, while the others are still cached there or leave in the same batch: `DeviceUnits`
remembers each unit's pages when a table registers it, and hands over the whole unit when the
device evicts that last page and every other page of the unit still holds its content.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import chain
from typing import cast


class DeviceUnits:
    """The units registered on the device: unit key -> (its keys and the device pages holding
    them at registration, last page first). An entry leaves when its last page is evicted
    (`evicted`) or the prefix cache is reset (`clear`)."""

    __slots__ = ("_pending_keys", "_pending_pages", "_units", "unit")

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self._units: dict[Hashable, tuple[tuple, tuple[int, ...]]] = {}
        # units evicted whole since the last `take_pending`: their device pages, unit by unit,
        # and keys
        self._pending_pages: list[int] = []
        self._pending_keys: list = []

    def __len__(self) -> int:
        return len(self._units)

    def note(self, pages: list[int], hashes: list, new: range | list[int], regular: bool,
             cached: dict) -> None:
        """A table registered its pages at indices `new` (with its `pages` and `hashes`):
        remember each unit whose last page is among them, with the device pages holding its
        content (the table's own where `regular`, else the prefix cache's)."""
        unit, units = self.unit, self._units
        if isinstance(new, range):
            lasts: range | list[int] = range(new.start + (-new.start - 1) % unit, new.stop, unit)
        else:
            lasts = [index for index in new if index % unit == unit - 1]
        for last in lasts:
            stop = last - unit if last >= unit else None
            # last page first, as the device evicts them; tuples of ints, which the garbage
            # collector stops tracking (thousands of lists held for long would slow its passes)
            keys = tuple(hashes[last:stop:-1])
            held = tuple(pages[last:stop:-1] if regular else map(cached.get, keys))
            if None not in held:
                units[keys[0]] = (keys, cast("tuple[int, ...]", held))

    def evicted(self, pages: list[int], keys: list, cached: dict) -> None:
        """The device evicts `pages` holding `keys` now (in order; `cached` no longer holds
        them): keep for `take_pending` the units whose last page is among them and whose other
        pages hold their content still (evicted in this batch from the page registered, or
        cached there), in eviction order. Every evicted unit key's entry is dropped."""
        units, unit = self._units, self.unit
        if len(keys) == 1 and keys[0] not in units:  # (one page taken for another: no unit)
            return
        found = units.keys() & keys  # (one pass in C; the usual batch has a unit in 16 pages)
        src_pages, unit_keys = self._pending_pages, self._pending_keys
        gone: dict | None = None  # key -> page of its first eviction in the batch, if needed
        index = 0
        while found:
            key = keys[index]
            if key not in found:
                index += 1
                continue
            found.discard(key)
            entry = units[key]
            if entry[1][0] != pages[index]:  # registered again elsewhere since: not this content
                index += 1
                continue
            del units[key]
            unit_keys_of, held = entry
            end = index + unit
            before = index - 1 if index else None  # (a reversed slice's end)
            if tuple(keys[index:end]) == unit_keys_of:  # the rest evicted right after it
                src_pages.extend(pages[end - 1 : before : -1])  # (the usual case)
                unit_keys.append(key)
                index = end
                continue
            num_here = len(keys) - index  # a unit the batch's end cuts: the rest still cached
            if num_here < unit and tuple(keys[index:]) == unit_keys_of[:num_here] \
                    and tuple(map(cached.get, unit_keys_of[num_here:])) == held[num_here:]:
                src_pages.extend(reversed(held[num_here:]))
                src_pages.extend(pages[:before:-1])
                unit_keys.append(key)
                break
            if tuple(map(cached.get, unit_keys_of[1:])) == held[1:] or _held(
                    unit_keys_of, held, cached,
                    gone := gone or dict(zip(reversed(keys), reversed(pages), strict=True))):
                src_pages.extend(reversed(held))
                unit_keys.append(key)
            # (else some page of the unit left the device before its last one: not written)
            index += 1

    def take_pending(self) -> tuple[list[int], list]:
        """The units evicted whole since the last call, each key once (its first eviction):
        (their device pages, unit by unit, and the unit keys)."""
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


def _held(keys: tuple, pages: tuple[int, ...], cached: dict, gone: dict) -> bool:
    """Whether each of `keys` is cached at, or was evicted in this batch from, its page."""
    return all(cached.get(key) == page or gone.get(key) == page
               for key, page in zip(keys, pages, strict=True))


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


def unit_slots(tier_pages: list[int], unit: int) -> list[int]:
    """The device-page slots of tier pages of `unit` device pages each, in order."""
    if unit == 1:
        return tier_pages
    starts = [page * unit for page in tier_pages]  # then a range each, in C
    return list(chain.from_iterable(map(range, starts, map(unit.__add__, starts))))
