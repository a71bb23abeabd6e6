"""Block tables of groups that keep only some of a request's tokens: a sliding window, chunked
local attention, or one fixed-size state (linear attention, Mamba).

The table keeps one entry per page of tokens, as full attention's does, but the pages no later
token reads are given back at the next allocation (vLLM's `remove_skipped_blocks`) and their
entries become `NULL_PAGE`. A page given back that holds registered content stays cached for
prefix hits. Which full pages of a sliding-window or state group are registered follows vLLM
0.32's `prefix_cache_retention_interval` R (`reachable_block_mask`): None, every one (dense);
otherwise only those a hit can use: the pages a hit at the prompt's end needs (its last token
is always computed, so the hit ends at the page boundary at or below prompt length - 1) and,
with R > 0, the pages a hit at each multiple of R tokens needs. A state group caches its state
at page boundaries (vLLM's mamba "align" mode): with prefix caching each allocation takes one
page, for the state at the end of what it computes, the boundaries a chunk passes inside
being `NULL_PAGE` (vLLM 0.32's `MambaManager.allocate_new_blocks`: a chunk's interior states
are never materialized, so a prefix hit ends where a chunk or a decode page did), and the
state before it is given back at the next allocation; without prefix caching, one page for
the whole request. (vLLM's extra prefill-checkpoint page is not modelled.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kvlab.policies.groups.full import FullAttentionManager
from kvlab.policies.groups.table import Plan, SeqState
from kvlab.policies.outputs import MemOps
from kvlab.policies.request import Request
from kvlab.policies.spec import PolicySpec
from kvlab.specs.kv_groups import NULL_PAGE, KVCacheGroup

if TYPE_CHECKING:
    from kvlab.policies.groups.hits import HeldKeys
    from kvlab.policies.page_pool import PagePool


_UNBOUNDED = 1 << 62


class WindowedManager(FullAttentionManager):
    """The block tables of one sliding-window, chunked-local or state group. Keys in the
    prefix cache are `(group_id, page hash)`: each group caches its own pages."""

    __slots__ = ("aligned", "group", "group_id", "retention_interval")

    def __init__(self, policy: PolicySpec, pool: PagePool, *, max_model_len: int,
                 group: KVCacheGroup, group_id: int,
                 retention_interval: int | None = None) -> None:
        super().__init__(policy, pool, max_model_len=max_model_len)
        self.group = group
        self.group_id = group_id
        self.retention_interval = retention_interval
        # a state group with prefix caching (vLLM's align mode): one page an allocation
        self.aligned = group.kind == "state" and self.caching

    def hashes_of(self, seq: Request) -> list:
        """The request's page keys in this group."""
        gid = self.group_id
        return [(gid, key) for key in seq.page_hashes(self.page_size)]

    # ----------------------------------------------------------------------------- windows

    def num_needed_pages(self, num_tokens: int) -> int:
        """Pages before a prefix hit of `num_tokens` tokens (whole pages) that a hit needs
        cached in this group (the tokens the next token reads)."""
        page_size = self.page_size
        if self.group.kind == "full":
            return num_tokens // page_size
        if self.group.kind == "state":
            return 1 if num_tokens else 0
        if self.group.kind == "chunked_local":
            return num_tokens // page_size - num_tokens // self.group.window * self.group.window \
                // page_size
        return min(num_tokens // page_size, -(-(self.group.window - 1) // page_size))

    def num_skipped_pages(self, num_computed_tokens: int) -> int:
        """Leading pages no token from `num_computed_tokens` on reads."""
        if self.group.kind == "state":
            if not self.caching:
                return 0  # one page, its state updated in place
            return max(0, num_computed_tokens - 1) // self.page_size
        return self.group.num_skipped_tokens(num_computed_tokens) // self.page_size

    def remove_skipped(self, state: SeqState, num_computed_tokens: int) -> None:
        """Give back the pages before the window (or chunk, or the last state) of a request
        with `num_computed_tokens` computed: kept cached where registered and retained."""
        start, end = state.num_null_pages, self.num_skipped_pages(num_computed_tokens)
        end = min(end, len(state.pages))
        if end <= start:
            return
        pool, owners, cached = self.pool, self.pool.owners, self.pool.cached
        to_cache, keys, to_free = [], [], []
        num_null = 0  # (an aligned state's interior boundaries: never live)
        for index in range(start, end):
            page = state.pages[index]
            if page == NULL_PAGE:
                num_null += 1
                continue
            state.pages[index] = NULL_PAGE
            if page in owners:
                pool.drop_owner(page)
                self.num_dup_slots -= self.page_size
                continue
            key = state.hashes[index] if index < state.num_hashed else None
            if key is not None and cached.get(key) == page:
                to_cache.append(page)
                keys.append(key)
            else:
                to_free.append(page)
        pool.release(to_cache[::-1], keys[::-1], range(len(to_cache)), to_free)
        self.num_live_slots -= (end - start - num_null) * self.page_size
        state.num_null_pages = end

    def register(self, seq: Request, state: SeqState, num_tokens: int) -> None:
        """Full attention's registration, of the pages a hit can use only (see the module)
        and not an aligned state's `NULL_PAGE`s."""
        retained = self.retention_interval is not None and self.group.kind in (
            "sliding_window", "state")
        if not retained and not self.aligned:
            super().register(seq, state, num_tokens)
            return
        if state.hash_outputs:
            state.hashes = self.hashes_of(seq)
        start, hashes = state.num_hashed, state.hashes
        num_full = min(len(hashes), num_tokens // self.page_size)
        if num_full <= start:
            return
        cached, pages = self.pool.cached, state.pages
        reachable = self._reachable_pages(seq) if retained else None
        new = [index for index in range(start, num_full)
               if pages[index] != NULL_PAGE and (reachable is None or reachable(index))
               and hashes[index] not in cached]
        for index in new:
            cached[hashes[index]] = state.pages[index]
        state.num_hashed = num_full
        if self.pool.events is not None:
            self._record_stored(seq, hashes, new)
        if self.tiers is not None and self.tiers.write_through:
            self.tiers.queue_through(state.pages, hashes, new, start, num_full, False)

    def _reachable_pages(self, seq: Request) -> Callable[[int], bool]:
        """Whether a page index of `seq`'s table can serve a prefix hit: the `need` pages
        before the prompt's last hit boundary and, every R tokens, before each multiple."""
        page_size, interval = self.page_size, self.retention_interval
        assert interval is not None
        boundary = (seq.prompt_len - 1) // page_size  # the hit at the prompt's end, in pages
        need = self.num_needed_pages(boundary * page_size) if boundary else 0
        per_segment = interval // page_size
        segment_need = self.num_needed_pages(interval) if interval else 0

        def reachable(index: int) -> bool:
            if boundary - need <= index < boundary:
                return True
            if not per_segment:
                return False
            return segment_need >= per_segment or index % per_segment >= per_segment - segment_need

        return reachable

    # ----------------------------------------------------------------------------- sizing

    def pages_to_add(self, num_held: int, total: int) -> int:
        """Full attention's, but a state group without prefix caching: one page in all; with
        it, one for the state at `total` tokens when that is past the table's end."""
        if self.group.kind == "state" and not self.caching:
            return 0 if num_held else 1
        if self.aligned:
            return int(-(-total // self.page_size) > num_held)
        return super().pages_to_add(num_held, total)

    def execute(self, seq: Request, total: int, state: SeqState | None, plan: Plan) -> MemOps:
        """Full attention's; an aligned state's new page (see the module) goes at the end of
        `total` tokens, `NULL_PAGE` for the boundaries before it."""
        if self.aligned and state is not None and plan.num_block_pages:
            gap = -(-total // self.page_size) - len(state.pages) - (plan.num_block_pages - plan.cow)
            if gap > 0:
                state.pages.extend([NULL_PAGE] * gap)
                self.num_live_slots -= gap * self.page_size  # (no state there: never live)
        return super().execute(seq, total, state, plan)

    def num_held(self, state: SeqState) -> int:
        """Pages the table holds (not its `NULL_PAGE`s)."""
        if self.aligned:
            return len(state.pages) - state.pages.count(NULL_PAGE)
        return len(state.pages) - state.num_null_pages

    def pages_to_start(self, seq: Request, total: int, num_hits: int) -> int:
        """A window's, chunk's or state's pages as it needs them, one at a time (a full group
        of this class: the policy's block)."""
        if self.group.kind == "full":
            return super().pages_to_start(seq, total, num_hits)
        return self.pages_to_add(num_hits, total)

    def pages_to_grow(self, seq: Request, total: int, state: SeqState) -> int:
        """`pages_to_start`'s pages for a held table, the copy of a shared page first."""
        if self.group.kind == "full":
            return super().pages_to_grow(seq, total, state)
        cow = self.shared_tail(state, total) is not None
        return self.pages_to_add(len(state.pages), total) + cow

    def freed_by_skip(self, state: SeqState, num_computed: int) -> list[int]:
        """Pages `remove_skipped` would return to the pool (not those others hold)."""
        end = min(self.num_skipped_pages(num_computed), len(state.pages))
        owners = self.pool.owners
        return [page for page in state.pages[state.num_null_pages : end]
                if page not in owners and page != NULL_PAGE]

    def fast_limit(self, state: SeqState) -> int:
        """Full attention's limit, short of the next token whose computing skips a page."""
        if self.group.kind == "state" and not self.caching:
            if not state.pages or state.pages[0] in self.pool.owners:  # (shared: copy first)
                return state.num_tokens
            return _UNBOUNDED  # one page whatever the length
        limit = super().fast_limit(state)
        if self.group.kind == "full":
            return limit
        next_skip = state.num_null_pages + 1  # the skipped pages that would be one more
        computed = next_skip * self.page_size  # least computed tokens that skip it
        if self.group.kind == "sliding_window":
            computed += self.group.window - 1
        elif self.group.kind == "state":
            computed += 1
        elif self.group.kind == "chunked_local":
            computed = -(-computed // self.group.window) * self.group.window
        # a decode of total t has t - 1 computed: stop before the first that skips
        return min(limit, computed)

    # ----------------------------------------------------------------------------- taking

    def shared_tail(self, state: SeqState, total: int) -> int | None:
        """Full attention's, and a state group's one page while shared (updated in place)."""
        if self.group.kind == "state" and not self.caching:
            shared = state.pages and total > state.num_tokens and state.pages[0] in self.pool.owners
            return 0 if shared else None
        return super().shared_tail(state, total)

    def fork(self, src: SeqState, child: Request) -> None:
        """Full attention's fork of the pages held (not those given back)."""
        super().fork(src, child)
        state = self.seqs[child.request_id]
        state.num_null_pages = src.num_null_pages
        self.num_live_slots -= state.pages.count(NULL_PAGE) * self.page_size  # (never live)
        if self.group.kind == "state" and not self.caching:
            src.fast_limit = state.fast_limit = src.num_tokens  # the next write copies it

    def take_hits(self, seq: Request, hits: list[int]) -> SeqState:
        """A new request's state in this group: `NULL_PAGE` entries before the hit pages this
        group needs."""
        return self.hold(seq, hits, self.pool.take_hits([page for page in hits
                                                         if page != NULL_PAGE]))

    def hold(self, seq: Request, hits: list[int], num_shared: int) -> SeqState:
        """Full attention's `hold`, of a table with `NULL_PAGE` entries before its pages."""
        real = [page for page in hits if page != NULL_PAGE]
        self.num_dup_slots += num_shared * self.page_size
        hashes = self.hashes_of(seq) if self.caching else []
        state = SeqState(list(hits), 0, 0, 0, len(hits), hashes, False, len(hits))
        state.num_null_pages = len(hits) - len(real)
        state.hash_outputs = self.hashes_outputs(seq)
        self.seqs[seq.request_id] = state
        self.num_live_slots += len(real) * self.page_size
        state.num_tokens = len(hits) * self.page_size
        return state

    def release(self, seq: Request, state: SeqState, num_written: int | None = None) -> None:
        """Full attention's release of the pages still held (no NULL_PAGE reaches the pool)."""
        super().release(seq, state, num_written)
        self.num_live_slots += state.pages.count(NULL_PAGE) * self.page_size  # never live

    def longest_hit(self, keys: list, bound: int, cached: HeldKeys | dict) -> int:
        """The most pages, at most `bound`, of a prefix hit valid in this group: the pages
        the next token reads all `cached` (on the device, or below it where tiers are)."""
        num_pages = bound
        while num_pages > 0:
            need = self.num_needed_pages(num_pages * self.page_size)
            missing = next((index for index in range(num_pages - 1, num_pages - need - 1, -1)
                            if keys[index] not in cached), None)
            if missing is None:
                return num_pages
            num_pages = missing  # a hit must end at or before the missing page
        return 0

    def hit_pages(self, keys: list, num_pages: int, cached: HeldKeys | dict) -> list[int]:
        """The table of a hit of `num_pages` pages: `NULL_PAGE` before the pages it needs
        (`BELOW` for one a tier holds)."""
        need = self.num_needed_pages(num_pages * self.page_size)
        return [NULL_PAGE] * (num_pages - need) + [cached[key] for key in
                                                    keys[num_pages - need : num_pages]]


def keeps_every_token(manager: FullAttentionManager) -> bool:
    """A full-attention group's manager (not a window's, a chunk's or a state's)."""
    return not isinstance(manager, WindowedManager) or manager.group.kind == "full"
