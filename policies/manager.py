"""The KV-cache manager: the one object the simulator and the engine ask for memory.

A coordinator (vLLM's `KVCacheCoordinator` and `KVCacheManager` in one) over the page pool
(`page_pool.py`), the block tables of each KV-cache group (`groups/`), the host swap space
(`host_pool.py`) and the memory tiers below the device (`tier_link.py`); the decode fast path is
`decode_path.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.decode_path import (
    DecodeAhead,
    advance_decodes,
    allocate_decodes,
    decode_run_ahead,
)
from kvlab.policies.groups.full import NO_OPS, FullAttentionManager
from kvlab.policies.groups.release import StepOrderError
from kvlab.policies.groups.table import Plan, SeqState
from kvlab.policies.host_pool import HostPool
from kvlab.policies.interfaces import Allocator, BlockSizing, Eviction
from kvlab.policies.manager_view import ManagerView
from kvlab.policies.outputs import MemOps
from kvlab.policies.page_pool import PagePool
from kvlab.policies.precision.check import check_precision
from kvlab.policies.precision.driver import PrecisionDriver
from kvlab.policies.precision.ladder import PrecisionLadder
from kvlab.policies.preemption.modes import PreemptionCosts, should_swap
from kvlab.policies.prefix_lookup import PrefixLookup
from kvlab.policies.request import Request
from kvlab.policies.spec import PolicySpec, parse_policy
from kvlab.policies.step_records import StepRecords
from kvlab.policies.tier_link import TierLink
from kvlab.policies.tiers import PrefixTier, TiersConfig
from kvlab.specs.kv_groups import KVCacheGroup

__all__ = ["NO_OPS", "DecodeAhead", "KVCacheManager", "StepOrderError"]


class KVCacheManager(ManagerView):
    """Pages, prefix cache, swap space and the policies that decide over them (torch-free).

    All methods are deterministic. A method returning `None` changed nothing. Sequences are keyed
    by `request_id`; the scheduler owns `num_computed_tokens`, and `allocate(seq, n)` makes room
    for tokens `[seq.num_computed_tokens, seq.num_computed_tokens + n)`.

    Calls between `begin_step()` and `end_step()` are one step: the executor carries out all
    their MemOps together, in MemOps order, then computes the tokens allocated (a call outside
    a step is a step of its own, its MemOps carried out before the next call). Within a step
    any order of calls is safe under three rules:

    - `can_swap_out` is False for a sequence given memory in the step (admitted, swapped in or
      forked): its pages may receive their KV later in the step. A page copied on write in the
      step is swapped out from the copy's source, and the host pages a swap-in reads are free
      again only at `end_step`, as are the pages of a sequence freed in the step that
      received swap-ins, tier loads or transfers in it.
    - A sequence whose pages others took as prefix hits before it computed them may not be
      freed or swapped out until it has (`StepOrderError`): their KV would never be written.
    - `fork` takes a parent that has computed every token it claimed and was not given memory
      in the step (`StepOrderError`).
    """

    __slots__ = ()  # (all on `ManagerView`)

    def __new__(cls, *args: object, groups: Sequence[KVCacheGroup] | None = None,
                **kwargs: object) -> KVCacheManager:
        """A `HybridKVCacheManager` for `groups` other than one full-attention group."""
        if cls is KVCacheManager and groups is not None and [g.kind for g in groups] != ["full"]:
            from kvlab.policies.hybrid_manager import HybridKVCacheManager  # (it extends this)

            return object.__new__(HybridKVCacheManager)
        return object.__new__(cls)

    def __init__(
        self,
        policy: PolicySpec | str,
        num_pages: int,
        *,
        max_model_len: int,
        num_host_pages: int | None = None,
        costs: PreemptionCosts | None = None,
        tiers: list[PrefixTier] | None = None,
        tier_config: TiersConfig | None = None,
        groups: Sequence[KVCacheGroup] | None = None,
        retention_interval: int | None = None,
        precision_ladder: PrecisionLadder | None = None,
    ) -> None:
        """`groups`: the model's KV-cache groups (default: one full-attention group; others
        make a `HybridKVCacheManager`, whose `retention_interval` is vLLM's
        `prefix_cache_retention_interval` for sliding-window and state groups: None, every
        page cached; 0, only what a hit at a prompt's end needs (vLLM 0.32's default); R,
        that and what a hit at each multiple of R tokens needs). `precision_ladder`: the
        levels a precision policy other than `none` demotes pages through (required then);
        the pool then holds more page ids than `num_pages`, the ones demotion has not paid
        for held back (policies/precision/ledger.py)."""
        del retention_interval  # (one full-attention group: nothing to keep)
        self.policy = spec = parse_policy(policy)
        if num_pages < 1:
            raise KvlabError(f"KV cache has {num_pages} pages; it needs at least one")
        if spec.preemption == "auto" and costs is None:
            raise KvlabError("preemption=auto needs a cost model to compare swap and recompute")
        self.page_size = spec.block_size
        self.max_model_len = max_model_len
        self.costs = costs
        precision = registry.get("precision", spec.precision).factory()
        num_device_pages = num_pages
        if precision.demotes:  # (page ids beyond the device's: policies/precision/ledger.py)
            num_pages += check_precision(spec, precision, precision_ladder, groups, num_pages)
        self.num_total_pages = num_device_pages
        self.allocator: Allocator = registry.get("allocation", spec.kind).factory(num_pages)
        self.evictor: Eviction = registry.get("eviction", spec.eviction).factory()
        self.caching: bool = self.evictor.caches
        block_sizing: BlockSizing = registry.get("block_sizing", spec.block_sizing).factory(
            self.page_size)
        self.pool = PagePool(self.allocator, self.evictor, num_pages,
                             exact_blocks=block_sizing.exact)
        self._main = FullAttentionManager(spec, self.pool, max_model_len=max_model_len)
        self.block_sizing = self._main.block_sizing
        self._seqs: dict[int, SeqState] = self._main.seqs  # the hot path's, read directly
        self._grow = self._main.grow_by_one_page if self.pool.free_list is not None else None
        host = num_device_pages if spec.host_pages is None else spec.host_pages
        self.host = HostPool(host if num_host_pages is None else num_host_pages)
        self._init_tiers(tiers, tier_config)
        self._lookup = PrefixLookup(self.pool, self.page_size, self.caching, self._tier_link)
        self._steps = StepRecords()  # what later calls of a step must know (step_records.py)
        self.precision: PrecisionDriver | None = None
        if precision.demotes:
            assert precision_ladder is not None
            self.precision = PrecisionDriver(self, precision, precision_ladder, num_device_pages)
            self._lookup.stop_at = self.precision.prefix_stops()

    def _init_tiers(self, tiers: list[PrefixTier] | None, config: TiersConfig | None) -> None:
        """The tiers below the device (policies/tiers/); None: none, and no cost anywhere."""
        if tiers and not self.caching:
            raise KvlabError("memory tiers hold prefix-cache pages: enable prefix caching "
                             "(an eviction policy other than none)", parameters=("kv_tiers",))
        self.tiers: list[PrefixTier] | None = list(tiers) if tiers else None
        self._tier_link: TierLink | None = None
        if self.tiers is not None:
            self._tier_link = TierLink(self.tiers, config or TiersConfig(), self.pool,
                                       self.page_size)
        self._main.tiers = self._tier_link

    # ----------------------------------------------------------------------------- allocation

    def can_allocate(self, seq: Request, num_new_tokens: int) -> bool:
        """Whether `allocate(seq, num_new_tokens)` would succeed now."""
        state = self._seqs.get(seq.request_id)
        if state is not None and seq.num_computed_tokens + num_new_tokens <= state.fast_limit:
            return True
        return self._plan(seq, num_new_tokens, state) is not None

    def allocate(self, seq: Request, num_new_tokens: int) -> MemOps | None:
        """Make room for `num_new_tokens` more tokens; None when memory is short (nothing changed).

        A new sequence first takes its prefix-cache hit (`seq.num_computed_tokens` must equal
        `num_computed_prefix_tokens(seq)`); new full prompt pages are registered in the cache.
        """
        state: SeqState | None
        try:
            state = self._seqs[seq.request_id]
        except KeyError:
            state = None
        else:
            total = seq.num_computed_tokens + num_new_tokens
            if total <= state.fast_limit:  # the common decode step: no page boundary crossed
                if total > state.num_tokens:
                    self._main.num_live_slots += total - state.num_tokens
                    state.num_tokens = total
                return NO_OPS
            if self._grow is not None and self._grow(state, total):
                return NO_OPS
        plan = self._plan(seq, num_new_tokens, state)
        if plan is None:
            return None
        if state is None:
            self._lookup.count(seq, plan)
        ops = self._main.execute(seq, seq.num_computed_tokens + num_new_tokens, state, plan)
        if self._steps.active:
            self._steps.allocated(seq.request_id, state is None, ops, NO_OPS)
        return ops

    def _plan(self, seq: Request, num_new_tokens: int, state: SeqState | None) -> Plan | None:
        total = seq.num_computed_tokens + num_new_tokens
        if state is None:
            hits, below, num_transfer = self._lookup.hit_pages(seq)
            plan = self._main.plan_new(seq, total, hits, watermark=True)
            if plan is not None:
                plan.tier_hits = below or None
                plan.num_transfer_pages = num_transfer
            return plan
        return self._main.plan_growth(seq, total, state)

    def allocate_decodes(self, requests: list[Request], start: int, budget: int) -> int:
        """Claim one token for each decode in `requests[start:]`, stopping at the first request
        that is not a decode or needs the planner; returns how many were claimed.

        Exactly `allocate(request, 1)` for each of them in order (at most `budget`): the same
        pages, evictions and counters. A decode is a request with computed tokens whose one
        uncomputed token is the last. A run goes on through a page boundary only where
        `allocate` would take the next page straight from the free list (or evict one cached
        page for it); whatever stops it is left to `allocate` (prefill chunks, block sizing,
        copy-on-write, a full memory and so preemption).
        """
        return allocate_decodes(self._main, requests, start, budget)

    def decode_run_ahead(self, requests: list[Request], max_steps: int) -> DecodeAhead | None:
        """How many steps (at most `max_steps`) of one decode token for each of `requests`
        take `allocate_decodes`' fast path only, none of them reaching its output length
        before the last: each request a plain decode (an output token already out) whose slot
        is unclaimed, with no page to register, copy or share ahead, and every page it fills
        next taken from the free list (no eviction). None when any request is not such a
        decode; otherwise the steps, with what `advance_decodes` and the caller's step
        records need (the requests' states, the sum and the largest of their computed tokens)
        so that no one walks the batch again for them."""
        if self._tier_link is not None and self._tier_link.has_through:
            return None
        if self.precision is not None:  # (the demotions due in the run planned: run.py)
            max_steps = self.precision.plan_run(requests, max_steps)
            if max_steps < 2:
                return None
        return decode_run_ahead(self._main, requests, max_steps)

    def advance_decodes(self, ahead: DecodeAhead, num_steps: int) -> list[int]:
        """Claim `num_steps` decode tokens for each sequence of `ahead` (`decode_run_ahead`
        must have allowed them, with nothing changed since), exactly as `num_steps` calls of
        `allocate_decodes` over the batch would, one step after another (the same pages in the
        same order). Returns the pages taken by the end of each step, cumulated. The caller
        commits the tokens."""
        if self.precision is None:
            return advance_decodes(self._main, ahead, num_steps)
        num_free = self.allocator.num_free_pages
        taken = advance_decodes(self._main, ahead, num_steps)
        ahead.pages_released = self.precision.commit_run(num_steps, num_free, taken)
        return taken

    def free(self, seq: Request) -> None:
        """Release everything the sequence holds, on device and host."""
        state = self._seqs.get(seq.request_id)
        if state is not None:
            self._main.check_release(seq, state)
            del self._seqs[seq.request_id]
            if self.precision is not None:
                self.precision.forget(state)
            if seq.request_id in self._steps.loaded:
                self._steps.defer_release(self._main, seq, state)
            else:
                self._main.release(seq, state)
        self.host.release(seq.request_id)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix and free its pages (vLLM's reset_prefix_cache), recorded
        as one cleared event; only while no sequence holds memory: False (nothing changed)
        otherwise."""
        if self._seqs or self.host.num_used_pages:
            return False
        pool = self.pool
        events, on_evicted = pool.events, pool.on_evicted
        pool.events = pool.on_evicted = None  # one cleared event; nothing written below
        try:
            pool.evict(len(self.evictor))
        finally:
            pool.events, pool.on_evicted = events, on_evicted
        assert not pool.cached, "a cached prefix outlived its pages"
        if self._tier_link is not None:
            self._tier_link.forget()
        self._lookup.forget()
        if events is not None:
            events.cleared()
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """Share the parent's filled pages with `child` (copy-on-write: a write copies first).

        The child carries the parent's tokens so far (the same prompt, and the same output ids
        where they are known)."""
        self._check_fork(parent, child)
        self._main.fork(self._seqs[parent.request_id], child)
        self._steps.given_memory(child.request_id)

    def _check_fork(self, parent: Request, child: Request) -> None:
        """StepOrderError unless the parent's claimed KV is all written (see the class)."""
        assert child.request_id not in self._seqs, "child already holds memory"
        src = self._seqs[parent.request_id]
        if parent.request_id in self._steps.new:
            raise StepOrderError(f"fork of request {parent.request_id}: it was given memory in "
                                 "this step; fork a parent whose KV is all written")
        if src.num_tokens != parent.num_computed_tokens:
            raise StepOrderError(
                f"fork of request {parent.request_id}: it has claimed {src.num_tokens} tokens "
                f"and computed {parent.num_computed_tokens}; fork a parent whose KV is all "
                "written")

    # ----------------------------------------------------------------------------- steps

    def begin_step(self) -> None:
        """A step's decisions start (see the class's rules): write through the pages
        registered by the step before (their KV is computed now)."""
        self._steps.active = True
        if self._tier_link is not None:
            self._tier_link.begin_step()
        if self.precision is not None:
            self.precision.begin_step()

    def end_step(self, ops: MemOps) -> None:
        """A step's decisions are made: append its tier writes to `ops` (in the order they
        were decided) and release the tier pages its loads read and the host pages its
        swap-ins read."""
        # (every step of every run: the common step, no tiers and nothing new, is three tests)
        if self._tier_link is not None:
            self._tier_link.end_step(ops)
        if self.precision is not None:
            self.precision.end_step(ops)
        steps = self._steps
        if not (steps.new or steps.copies):  # (the common step: nothing to forget)
            steps.active = False
            return
        if steps.new:  # (swapped-in and loaded requests, freed or not, are among these)
            self.host.free_held()
        for group, seq, state, num_written in steps.end():
            group.release(seq, state, num_written)

    def count_first_hits(self) -> None:
        """The sequence just allocated is at its first admission: add its hits, level by
        level, to `first_hit_pages` (the basis of `Request.num_cached_tokens`)."""
        if self._tier_link is not None:
            self._tier_link.count_first_hits()

    def check_tiers(self, *, distinct: bool = True) -> None:
        """Conservation in every tier (AssertionError otherwise); nothing pinned between steps.
        `distinct`: also that no two keys share a tier page (`PrefixTier.check`)."""
        if self._tier_link is not None:
            self._tier_link.check(distinct=distinct)

    # ----------------------------------------------------------------------------- swapping

    def should_swap(self, seq: Request) -> bool:
        """Whether the preemption mode swaps this victim (else it is recomputed)."""
        num_tokens = seq.num_computed_tokens
        if seq.request_id not in self._seqs or num_tokens == 0:
            return False
        num_pages = -(-num_tokens // self.page_size)
        return should_swap(self.policy.preemption, num_pages, 1, num_tokens, self.costs)

    def can_swap_out(self, seq: Request) -> bool:
        """Whether the host pool has room for the sequence's computed pages, and its pages
        hold their KV when this step's swap-outs run (not a sequence given memory in the
        step: see the class's rules)."""
        if seq.request_id not in self._seqs or seq.request_id in self._steps.new:
            return False
        return self.host.can_store(-(-seq.num_computed_tokens // self.page_size))

    def swap_out(self, seq: Request) -> MemOps:
        """Copy the pages of the computed tokens to host memory and release all device pages
        (a page copied on write in this step is read from the copy's source: swap-outs run
        before copies)."""
        assert seq.request_id not in self._steps.new, "call can_swap_out first"
        state = self._seqs[seq.request_id]
        self._main.check_release(seq, state)
        del self._seqs[seq.request_id]
        if self.precision is not None:
            self.precision.forget(state)
        num_tokens = seq.num_computed_tokens
        num_filled = -(-num_tokens // self.page_size)
        assert self.host.can_store(num_filled), "call can_swap_out first"
        host_pages = self.host.store(seq.request_id, num_filled, num_tokens)
        pages = self._steps.sources(state.pages[:num_filled])
        ops = MemOps(swap_outs=list(zip(pages, host_pages, strict=True)))
        self._main.release(seq, state)
        return ops

    def can_swap_in(self, seq: Request) -> bool:
        """Whether device memory has room to bring the sequence back, keeping the watermark free
        (as vLLM v0 did): without it a swapped-in request preempts another at its next page."""
        stored = self.host.stored(seq.request_id)
        return stored is not None and self._main.plan_new(
            seq, stored[1], [], watermark=True) is not None

    def swap_in(self, seq: Request) -> MemOps | None:
        """Bring the sequence's pages back from host memory; None when device memory is short."""
        stored = self.host.stored(seq.request_id)
        assert stored is not None, "swap_in of a sequence not swapped out"
        host_pages, num_tokens = stored
        plan = self._main.plan_new(seq, num_tokens, [], watermark=True)
        if plan is None:
            return None
        self.host.release(seq.request_id, hold=self._steps.active)
        self._main.execute(seq, num_tokens, None, plan)
        self._lookup.forget()
        self._steps.given_memory(seq.request_id, loaded=True)
        pages = self._seqs[seq.request_id].pages
        return MemOps(swap_ins=list(zip(host_pages, pages[: len(host_pages)], strict=True)))
