"""A prefix lookup below the device: the pages of a run of keys, tier by tier (`tier_chain`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from kvlab.policies.tiers.store import TierStore

# A lookup's hits below the device: runs (level, tier slots) of pages found in one tier, in
# order (slots a list, or `UnitSlots` for tier pages of several device pages)
TierRuns = list[tuple[int, Sequence[int]]]


def tier_chain(tiers: Sequence[TierStore], keys: list) -> TierRuns:
    """The pages of each key in turn, from the first of `tiers` (level 1 first) holding it, up
    to the first key none holds, as runs `(level, pages)` of keys found in one tier: a prefix
    lookup below the device."""
    # A chain is runs of keys found in one tier (a prompt's pages move down together), so
    # the work is in C per run: the run's tier is the first holding its first key; its
    # pages, from that tier's column (a lookup per key from where the chain first needs the
    # tier, kept for later runs), to the first key the tier lacks; a higher tier holding none
    # of the run's keys (the usual case) is one membership pass.
    columns: dict[int, tuple[int, list]] = {}  # level -> (first key's index, pages from it)
    chain: TierRuns = []
    start, num_keys = 0, len(keys)
    while start < num_keys:
        key = keys[start]
        level = next((level for level, held in enumerate(tiers, 1) if key in held), 0)
        if not level:
            break
        if level not in columns:
            columns[level] = (start, tiers[level - 1].pages_of(keys[start:]))
        first, pages = columns[level]
        end = _index_of(pages, None, start - first, len(pages)) + first
        for above in tiers[: level - 1]:  # a higher tier's copy breaks the run
            if above.holds_any(keys[start:end]):
                found = above.holds_each(keys[start:end])
                end = _index_of(found, True, 0, end - start) + start
        chain.append((level, cast("list[int]", pages[start - first : end - first])))
        start = end
    return chain


def chain_length(chain: TierRuns) -> int:
    """The pages in a `tier_chain`."""
    return sum(len(pages) for _, pages in chain)


def chain_head(chain: TierRuns, num_pages: int) -> TierRuns:
    """The first `num_pages` pages of a `tier_chain` (all of it when it is shorter)."""
    head: TierRuns = []
    for level, pages in chain:
        if num_pages <= 0:
            break
        head.append((level, pages if len(pages) <= num_pages else pages[:num_pages]))
        num_pages -= len(pages)
    return head


def _index_of(values: Sequence, value: object, start: int, end: int) -> int:
    """The first index of `value` in values[start:end] (by equality), else `end`."""
    try:
        return values.index(value, start, end)
    except ValueError:
        return end
