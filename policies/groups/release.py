"""Giving a block table's pages back: to the prefix cache where registered, else freed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.policies.groups.table import SeqState
from kvlab.policies.request import Request
from kvlab.specs.kv_groups import NULL_PAGE

if TYPE_CHECKING:
    from kvlab.policies.page_pool import PagePool


class StepOrderError(RuntimeError):
    """A caller broke one of the rules on the order of calls in a step (`KVCacheManager`)."""


class TableRelease:
    """The release half of a group's block tables (`FullAttentionManager`)."""

    __slots__ = ("num_dup_slots", "num_live_slots")  # (see `FullAttentionManager`)
    num_dup_slots: int
    num_live_slots: int
    page_size: int
    pool: PagePool

    if TYPE_CHECKING:  # the group's own, defined beside its allocation
        def register(self, seq: Request, state: SeqState, num_tokens: int) -> None: ...
        def fill(self, index: int, num_tokens: int) -> int: ...

    def check_release(self, seq: Request, state: SeqState) -> None:
        """Raise StepOrderError where releasing `seq` now would leave another table holding
        pages it registered but has not computed (taken as prefix hits in this step)."""
        page_size, owners = self.page_size, self.pool.owners
        num_written = seq.num_computed_tokens
        if not owners or state.num_hashed * page_size <= num_written:
            return
        unwritten = state.pages[num_written // page_size : state.num_hashed]
        if any(page in owners for page in unwritten):
            raise StepOrderError(
                f"request {seq.request_id} is released with pages that others took as prefix "
                "hits before it computed them; release it only after the step that computes "
                "them (or before another request hits them)")

    def release(self, seq: Request, state: SeqState, num_written: int | None = None) -> None:
        """Drop one owner from each page. Pages left with none are cached if registered, tail
        first (so LRU evicts deep prompt pages before the roots they hang from), else freed in
        table order. Only the KV of `num_written` tokens (default `seq.num_computed_tokens`)
        was written: pages registered past them are taken out of the cache, and pages they
        fill are put in."""
        if num_written is None:
            num_written = seq.num_computed_tokens
        if state.hash_outputs:
            self.register(seq, state, min(num_written, state.num_tokens))
        self.unregister_unwritten(state, num_written)
        pages, end, owners = state.pages, state.num_hashed, self.pool.owners
        if state.regular:
            first, still_held = self._shared_pages_of_regular(state) if owners else (0, None)
            if first is not None:  # the shared pages are pages[:first]
                if first:
                    self._unshare(state, set(pages[:first]), full=True)
                to_cache, keys = pages[first:end][::-1], state.hashes[first:end][::-1]
                depths: range | list[int] = range(end - 1, first - 1, -1)
            else:
                assert still_held is not None
                self._unshare(state, still_held, full=True)
                kept = [index for index in range(end) if pages[index] not in still_held]
                to_cache = [pages[index] for index in reversed(kept)]
                keys = [state.hashes[index] for index in reversed(kept)]
                depths = kept[::-1]
            to_free = pages[max(first or 0, end) :]
        else:
            still_held = owners.keys() & pages if owners else set()
            if still_held:
                self._unshare(state, still_held, full=False)
            to_cache, keys, depths, to_free = self._sort_released(state, still_held)
        self.pool.release(to_cache, keys, depths, to_free)
        self.num_live_slots -= state.num_tokens

    def unregister_unwritten(self, state: SeqState, num_written: int) -> None:
        """Take out of the prefix cache the registered pages past the first `num_written`
        tokens: a sequence preempted or freed in the step that registered them never computes
        them. A release deferred to the step's end calls this at once
        (`StepRecords.defer_release`): a later lookup of the step must not take them as hits."""
        if state.num_hashed * self.page_size <= num_written:
            return
        num_full = num_written // self.page_size
        self.pool.uncache(state.hashes[num_full : state.num_hashed],
                          state.pages[num_full : state.num_hashed])
        state.num_hashed = num_full

    def _shared_pages_of_regular(self, state: SeqState) -> tuple[int | None, set[int] | None]:
        """The pages of a regular table that other tables hold: (k, None) when they are its
        first k pages (the common case), else (None, the set of them).

        Only registered pages can be in another table, and they are full. They are any of its
        own prefix hits (a hit may take pages from several tables, whose other owners leave
        one by one), and the run after them that later requests hit: a hit on page j of this
        table takes every page before it too."""
        pages, owners, num_hits = state.pages, self.pool.owners, state.num_hit_pages
        hits = pages[:num_hits]
        num_held = sum(map(owners.__contains__, hits)) if num_hits else 0  # a C loop
        run, end = num_hits, state.num_hashed
        while run < end and pages[run] in owners:
            run += 1
        if num_held == num_hits:
            return run, None
        return None, {page for page in hits if page in owners} | set(pages[num_hits:run])

    def _sort_released(
        self, state: SeqState, still_held: set[int]
    ) -> tuple[list[int], list, list[int], list[int]]:
        """The general case of `release`: (registered pages tail first, their hashes, their
        depths, the other pages in table order), leaving out the pages still held."""
        cached, hashes = self.pool.cached, state.hashes
        to_cache, keys, depths, to_free = [], [], [], []
        for index, page in enumerate(state.pages):
            if page in still_held or page == NULL_PAGE:
                continue
            if index < len(hashes) and cached.get(hashes[index]) == page:
                to_cache.append(page)
                keys.append(hashes[index])
                depths.append(index)
            else:
                to_free.append(page)
        return to_cache[::-1], keys[::-1], depths[::-1], to_free

    def _unshare(self, state: SeqState, shared: set[int], *, full: bool) -> None:
        """Drop this sequence from the owners of its `shared` pages (`full`: every one of them
        is a full page of its table)."""
        if full:
            self.num_dup_slots -= len(shared) * self.page_size
        else:
            self.num_dup_slots -= sum(
                self.fill(index, state.num_tokens)
                for index, page in enumerate(state.pages)
                if page in shared
            )
        for page in shared:
            self.pool.drop_owner(page)
