"""The protocols of the policy families: what `KVCacheManager` asks of each implementation.

A new policy is one small file implementing one of these, one `@register` line, and a test
(docs/architecture.md, "Where to add"). The manager reads an implementation's capabilities
(attributes such as `Allocator.free_list` or `BlockSizing.exact`), never its name.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol

from kvlab.policies.request import Request


class Allocator(Protocol):
    """The address-space policy: owns the truly free pages (no owner, no cached content) and
    hands out blocks of them. Cached pages belong to the eviction policy until evicted.

    Capabilities: `free_list` is the FIFO free list itself when any free page serves any block
    (paging: the manager's hot path takes pages from it directly), else None; `reserves_region`
    is True when a request holds one region sized by its reservation rule (contiguous), where
    block sizing does not apply and a region grows only by another region.
    """

    num_total_pages: int
    num_free_pages: int
    free_list: deque[int] | None
    reserves_region: bool

    def pages_for(self, num_pages: int) -> int:
        """How many pages a request for `num_pages` actually receives (buddy rounds up)."""
        ...

    def allocate(self, num_pages: int) -> list[int] | None:
        """Take a block of `pages_for(num_pages)` pages, or None (nothing changed)."""
        ...

    def can_allocate(self, num_pages: int, extra_free: list[int] = ()) -> bool:  # type: ignore[assignment]
        """Whether `allocate(num_pages)` would succeed if `extra_free` pages were released first."""
        ...

    def release(self, pages: list[int]) -> None:
        """Give pages back (any order; runs are merged where the policy merges)."""
        ...

    def num_unusable_free_pages(self) -> int:
        """Free pages outside the largest block it can hand out (external fragmentation)."""
        ...


class BlockSizing(Protocol):
    """How many pages the next block of a sequence takes.

    Capability: `exact` is True when every block is exactly the pages needed now (a decode that
    crosses a page boundary takes one page: the manager's fast path).
    """

    exact: bool

    def pages_for_next_block(self, seq: Request, num_blocks: int, num_pages_needed: int) -> int:
        """At least `num_pages_needed`; `num_blocks` is how many blocks `seq` already holds."""
        ...


class Eviction(Protocol):
    """Which cached-free page (prefix content, no owner) is reused first.

    It holds exactly the cached-free pages. `caches` is False only for `none` (no prefix
    caching). A policy may add the batched forms `add_pages(pages, keys)`,
    `pop_victims(n) -> (pages, keys)`, `take_hits(pages) -> taken` and `recycle(n, keys) ->
    (pages, keys)` (see `BatchedEviction`); `add_cached`, `pop_victims`, `take_hits` and
    `recycle` below use them when there.
    """

    caches: bool

    def __len__(self) -> int:
        """Cached-free pages held."""
        ...

    def __contains__(self, page_id: int) -> bool:
        """Whether the page is cached-free."""
        ...

    def add(self, page_id: int, depth: int, key: Hashable) -> None:
        """A cached page (at index `depth` of its sequence, holding prefix hash `key`) lost its
        last owner."""
        ...

    def remove(self, page_id: int) -> None:
        """A prefix hit took the page back."""
        ...

    def on_hit(self, page_id: int) -> None:
        """Every prefix hit on the page (cached-free or held)."""
        ...

    def pop_victim(self) -> tuple[int, Hashable]:
        """The page to reclaim next and its key (the manager drops the content); LookupError
        when none is cached."""
        ...

    def pages(self) -> list[int]:
        """The cached-free pages, in no particular order."""
        ...


class BatchedEviction(Eviction, Protocol):
    """An eviction policy with batched forms of `add` and `pop_victim` (LRU): a finished or
    preempted sequence hands back dozens of pages at once."""

    def add_pages(self, page_ids: Sequence[int], keys: list) -> None:
        """`add` of each page with its key, in order."""
        ...

    def pop_victims(self, num_pages: int) -> tuple[list[int], list]:
        """`pop_victim` `num_pages` times: the pages and their keys."""
        ...

    def take_hits(self, page_ids: list[int]) -> list[bool]:
        """A prefix hit on each page in turn: `remove` where it is cached-free, then
        `on_hit`; whether each was cached-free."""
        ...

    def recycle(self, num_pages: int, keys: list) -> tuple[list[int], list]:
        """`pop_victims(num_pages)`, then `add_pages` of the same pages holding `keys` (as
        many): the victims' pages and the keys they held."""
        ...


def add_cached(evictor: Eviction, page_ids: Sequence[int], keys: list,
               depths: Iterable[int] | None = None) -> None:
    """`evictor.add` of each page with its key (and its depth in its sequence; 0 where
    unknown), in order: in one call of the policy's batched `add_pages` where it has one."""
    add_pages = getattr(evictor, "add_pages", None)
    if add_pages is not None:
        add_pages(page_ids, keys)
        return
    add = evictor.add
    depths = [0] * len(page_ids) if depths is None else depths
    for page, depth, key in zip(page_ids, depths, keys, strict=True):
        add(page, depth, key)


def pop_victims(evictor: Eviction, num_pages: int) -> tuple[list[int], list]:
    """`evictor.pop_victim` `num_pages` times, (pages, their keys): in one call of the
    policy's batched `pop_victims` where it has one."""
    batched = getattr(evictor, "pop_victims", None)
    if batched is not None:
        pages, keys = batched(num_pages)
        return pages, keys
    pages, keys = [], []
    for _ in range(num_pages):
        page, key = evictor.pop_victim()
        pages.append(page)
        keys.append(key)
    return pages, keys


def recycle(evictor: Eviction, num_pages: int, keys: list) -> tuple[list[int], list]:
    """Reuse the next `num_pages` victims at once for new content `keys` (a tier storing over
    its oldest pages): `pop_victims`, then `add_cached` of those pages with `keys`; in one call
    of the policy's batched `recycle` where it has one. Returns the pages and their old keys."""
    batched = getattr(evictor, "recycle", None)
    if batched is not None:
        pages, old_keys = batched(num_pages, keys)
        return pages, old_keys
    pages, old_keys = pop_victims(evictor, num_pages)
    add_cached(evictor, pages, keys)
    return pages, old_keys


def take_hits(evictor: Eviction, page_ids: list[int]) -> list[bool]:
    """A prefix hit on each page in turn (`remove` where the policy holds it, then `on_hit`);
    whether each was held: in one call of the policy's batched `take_hits` where it has one."""
    batched = getattr(evictor, "take_hits", None)
    if batched is not None:
        taken: list[bool] = batched(page_ids)
        return taken
    taken = []
    for page in page_ids:
        held = page in evictor
        if held:
            evictor.remove(page)
        evictor.on_hit(page)
        taken.append(held)
    return taken


# Contiguous reservation: (request's total length, max_model_len) -> tokens reserved.
ReserveRule = Callable[[int, int], int]
