"""A new request's prefix hit under KV-cache groups: the longest valid in every group, its pages
on the device or, where memory tiers are, in a tier below it.

A hit of n pages is valid in a group when the pages its next token reads are all held: every
page for full attention, the window's (or chunk's, or the last state's) for the others
(`WindowedManager.num_needed_pages`). A page is held on the device (the pool's prefix-cache
index) or in a tier; each page is looked up on its own, the device first, so a window whose
older pages went down to a tier while newer ones stayed cached on the device still hits (a
window's pages leave the device oldest first). A page a tier holds is `BELOW` in the hit's
table: a fresh device page loads it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from kvlab.policies.groups.full import FullAttentionManager

if TYPE_CHECKING:
    from kvlab.policies.tiers import TierStore

BELOW = -2  # a hit page whose content a tier holds (`NULL_PAGE` is -1)


class HeldKeys:
    """The prefix-cache index of the device with the tiers' stores below it: `key in held`
    and `held[key]` (the device page, else `BELOW`)."""

    __slots__ = ("_cached", "_stores")

    def __init__(self, cached: dict, stores: Sequence[TierStore]) -> None:
        self._cached = cached
        self._stores = stores

    def __contains__(self, key: Hashable) -> bool:
        return key in self._cached or any(key in store for store in self._stores)

    def __getitem__(self, key: Hashable) -> int:
        page = self._cached.get(key)
        return BELOW if page is None else page


def longest_hit(managers: Sequence[FullAttentionManager], keys: list[list], bound: int,
                held: HeldKeys | dict) -> tuple[int, list[list[int]]]:
    """The most pages (at most `bound`) of a hit valid in every group (`keys`: each group's
    page keys), and each group's table for it."""
    from kvlab.policies.groups.windowed import WindowedManager  # (it extends the full one)

    num_pages = bound
    for manager, group_keys in zip(managers, keys, strict=True):
        if type(manager) is FullAttentionManager:
            num_pages = next((i for i, key in enumerate(group_keys[:num_pages])
                              if key not in held), num_pages)
    while True:  # windows may need pages a shorter hit does not: to a fixed point
        start = num_pages
        for manager, group_keys in zip(managers, keys, strict=True):
            if isinstance(manager, WindowedManager):
                num_pages = manager.longest_hit(group_keys, num_pages, held)
        if num_pages == start:
            break
    tables = [manager.hit_pages(group_keys, num_pages, held)
              if isinstance(manager, WindowedManager)
              else [held[key] for key in group_keys[:num_pages]]
              for manager, group_keys in zip(managers, keys, strict=True)]
    return num_pages, tables
