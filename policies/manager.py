"""The KV-cache manager: the one object the simulator and the engine ask for memory."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from itertools import chain, compress
from typing import cast

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.host_pool import HostPool
from kvlab.policies.interfaces import (
    Allocator,
    BlockSizing,
    Eviction,
    ReserveRule,
    add_cached,
    pop_victims,
)
from kvlab.policies.kv_events import KVEventLog
from kvlab.policies.outputs import MemOps, MemoryUsage, TierBatch
from kvlab.policies.preemption.modes import PreemptionCosts, should_swap
from kvlab.policies.request import Request
from kvlab.policies.spec import PolicySpec, parse_policy
from kvlab.policies.tiers import (
    PrefixTier,
    TiersConfig,
    TierStats,
    chain_head,
    chain_length,
    tier_chain,
)

# Returned when a decision needs no physical work. Shared: callers must never mutate a MemOps
# they get from the manager (the scheduler copies them into its own per-step MemOps).
NO_OPS = MemOps()


@dataclass(slots=True)
class _SeqState:
    """A sequence's memory: its block table and how far allocate() may go without the slow path."""

    pages: list[int]
    num_tokens: int  # token slots claimed: KV written, or being written this step
    fast_limit: int  # allocate() up to this many tokens is a counter update (O(1))
    num_blocks: int  # blocks taken so far (block-sizing policies grow with it)
    num_hashed: int  # leading pages registered in the prefix cache (or known to be there)
    hashes: list  # the prompt's page hashes (empty without prefix caching)
    # True while exactly pages[:num_hashed] are registered, each under its own page hash (no
    # fork, no page whose content was already cached elsewhere): releasing then needs no
    # lookup per page.
    regular: bool = True
    num_hit_pages: int = 0  # leading pages taken as prefix-cache hits at admission
    # True when output pages get hashes as they fill (token ids known, prefix caching on): the
    # fast path then stops where each page fills, so it is registered in the step that fills it.
    hash_outputs: bool = False


@dataclass(slots=True)
class _Plan:
    """What an allocation will do, computed before anything changes."""

    hit_pages: list[int]
    num_block_pages: int  # pages asked of the allocator as one block (0: none)
    cow: bool  # the block's first page replaces the shared, partly filled last page
    # The pages as power-of-two runs, largest first, instead of one block: a request alone in
    # memory whose own blocks would not fit (see `_plan_new`).
    as_runs: bool = False
    # Prefix hits below the device, after `hit_pages`, as runs (level, tier slots): loaded
    # into the block's first pages.
    tier_hits: list[tuple[int, list[int]]] | None = None
    # Pages after those whose KV another instance sends (`Request.kv_transfer_tokens`).
    num_transfer_pages: int = 0


@dataclass(slots=True)
class DecodeAhead:
    """A run of plain decode steps the batch can take on the fast path
    (`KVCacheManager.decode_run_ahead`): how many steps, the sequences' states in batch order,
    and the sum and the largest of their computed tokens before the first step."""

    num_steps: int
    states: list[_SeqState]
    sum_computed: int
    max_computed: int


class StepOrderError(RuntimeError):
    """A caller broke one of the rules on the order of calls in a step (`KVCacheManager`)."""


class KVCacheManager:
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

    # Slotted: every decode step reads and writes a few of these.
    __slots__ = (
        "_cache_epoch",
        "_cached",
        "_free_list",
        "_in_step",
        "_last_hit_levels",
        "_last_lookup",
        "_num_dup_slots",
        "_num_live_slots",
        "_owners",
        "_reserve",
        "_reuse",
        "_seqs",
        "_step_copies",
        "_step_freed",
        "_step_loaded",
        "_step_new",
        "_through_keys",
        "_through_pages",
        "_tier_unit",
        "_tier_writes",
        "_write_backs",
        "allocator",
        "block_sizing",
        "caching",
        "costs",
        "events",
        "evictor",
        "first_hit_pages",
        "host",
        "max_model_len",
        "num_prefix_hits",
        "num_prefix_queries",
        "num_total_pages",
        "page_size",
        "policy",
        "store_threshold",
        "tier_stats",
        "tiers",
        "watermark_pages",
        "write_through",
    )

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
    ) -> None:
        self.policy = parse_policy(policy)
        if num_pages < 1:
            raise KvlabError(f"KV cache has {num_pages} pages; it needs at least one")
        if self.policy.preemption == "auto" and costs is None:
            raise KvlabError("preemption=auto needs a cost model to compare swap and recompute")
        spec = self.policy
        self.page_size = spec.block_size
        self.num_total_pages = num_pages
        self.max_model_len = max_model_len
        self.costs = costs
        self.allocator: Allocator = registry.get("allocation", spec.kind).factory(num_pages)
        self.block_sizing: BlockSizing = registry.get("block_sizing", spec.block_sizing).factory(
            self.page_size
        )
        self.evictor: Eviction = registry.get("eviction", spec.eviction).factory()
        self.caching: bool = self.evictor.caches
        self._reserve: ReserveRule = registry.get("reserve", spec.reserve).factory
        # Exact blocks from a free list grow by one page taken straight from it: a fast path.
        exact = self.block_sizing.exact
        self._free_list: deque[int] | None = self.allocator.free_list if exact else None
        self.watermark_pages = int(spec.watermark * num_pages)
        # Owners are counted only for pages shared by two or more sequences: a page in one
        # block table is the common case, and leaving it out of every count keeps taking and
        # releasing runs of pages free of Python work per page.
        self._owners: dict[int, int] = {}  # page -> number of block tables holding it (>= 2)
        # prefix hash -> the page holding it. A page at index i of a block table is registered
        # exactly when this maps the table's i-th page hash to it.
        self._cached: dict = {}
        self._seqs: dict[int, _SeqState] = {}
        host = num_pages if spec.host_pages is None else spec.host_pages
        self.host = HostPool(host if num_host_pages is None else num_host_pages)
        self._num_live_slots = 0  # sum of claimed tokens over sequences...
        self._num_dup_slots = 0  # ...minus this: tokens counted twice because a page is shared
        self.num_prefix_queries = 0
        self.num_prefix_hits = 0
        # The last lookup: (request, cache epoch, hit pages[, tier hits, tier epoch]). The epoch
        # counts keys that left the cache; a lookup from another epoch may name a page that
        # holds other content now.
        self._last_lookup: tuple | None = None
        self._cache_epoch = 0
        # Set to a KVEventLog to record every prefix-cache change (vLLM's KV events).
        self.events: KVEventLog | None = None
        # Within a step (`begin_step` to `end_step`) the MemOps of every call run together, in
        # MemOps order, before the step computes: what later calls must know of earlier ones.
        self._in_step = False
        self._step_copies: dict[int, int] = {}  # copy-on-write this step: destination -> source
        self._step_new: set[int] = set()  # requests given memory this step (KV may come later)
        # of those, the ones whose pages receive swap-ins, tier loads or transfers (the last
        # MemOps), and the ones of them freed since: released at `end_step`, so that no
        # earlier copy or swap-in of the step writes their pages before those writes do
        self._step_loaded: set[int] = set()
        self._step_freed: list[tuple[Request, _SeqState, int]] = []
        self._init_tiers(tiers, tier_config)

    def _init_tiers(self, tiers: list[PrefixTier] | None, config: TiersConfig | None) -> None:
        """The tiers below the device (policies/tiers.py); None: none, and no cost anywhere."""
        if tiers and not self.caching:
            raise KvlabError("memory tiers hold prefix-cache pages: enable prefix caching "
                             "(an eviction policy other than none)", parameters=("kv_tiers",))
        config = config or TiersConfig()
        self.tiers: list[PrefixTier] | None = list(tiers) if tiers else None
        self.write_through = config.write_policy == "write-through"
        self.store_threshold = config.store_threshold
        # device pages per tier page: tier page p is slots p * unit onwards of the tier's
        # memory (executors copy device pages); a unit of several pages is written through
        # whole, never back (its pages leave the device one by one)
        self._tier_unit = config.block_pages(self.page_size)
        assert all(tier.block_pages == self._tier_unit for tier in self.tiers or ()), \
            "tiers built for another kv_tier_block_size"
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
        self._last_hit_levels: list[int] = []
        self.first_hit_pages: list[int] = [0] * (1 + len(self.tiers or ()))
        # what this manager did in each tier: all of a tier's counters, but for a pool that a
        # cluster's managers share (whose own `stats` are the pool's, all instances together)
        self.tier_stats: list[TierStats] = [TierStats() for _ in self.tiers or ()]

    # ----------------------------------------------------------------------------- queries

    @property
    def num_host_pages(self) -> int:
        """Host swap pages in all."""
        return self.host.num_total_pages

    @property
    def num_free_pages(self) -> int:
        """Pages with no owner and no cached content."""
        return self.allocator.num_free_pages

    @property
    def num_cached_free_pages(self) -> int:
        """Pages with no owner that still hold a cached prefix (reclaimable)."""
        return len(self.evictor)

    @property
    def num_used_pages(self) -> int:
        """Pages held by at least one sequence."""
        return self.num_total_pages - self.allocator.num_free_pages - len(self.evictor)

    def block_table(self, seq: Request) -> list[int]:
        """The sequence's page ids in token order (empty when it holds none). Do not mutate."""
        state = self._seqs.get(seq.request_id)
        return state.pages if state is not None else []

    def num_pages_held(self, seq: Request) -> int:
        """Pages in the sequence's block table."""
        state = self._seqs.get(seq.request_id)
        return len(state.pages) if state is not None else 0

    def num_owners(self, page: int) -> int:
        """How many block tables hold `page` (0: free or cached-free). A debugging aid: O(pages
        held) for a page not shared, which the manager does not count."""
        count = self._owners.get(page)
        if count is not None:
            return count
        return int(any(page in state.pages for state in self._seqs.values()))

    def is_swapped(self, seq: Request) -> bool:
        """True while the sequence's KV lives in host memory."""
        return self.host.holds(seq.request_id)

    def num_computed_prefix_tokens(self, seq: Request) -> int:
        """Leading tokens whose KV is cached, in whole pages, capped at the token count - 1 (as
        vLLM: the last token is always computed). A request recomputed after preemption can hit
        its output pages too where their ids are known (`Request.output_ids_known`)."""
        if not self.caching:
            return 0
        hashes = seq.page_hashes(self.page_size)
        limit = self._num_lookup_pages(seq)
        cached = self._cached
        pages: list[int] = []
        for key in hashes[:limit]:
            page = cached.get(key)
            if page is None:
                break
            pages.append(page)
        self._last_lookup = (seq.request_id, self._cache_epoch, pages)
        if self.tiers is not None and len(pages) < limit:
            self._flush_write_backs()  # content evicted this step is found below
            below = self._tier_chain(hashes, len(pages), limit)
            self._last_lookup = (seq.request_id, self._cache_epoch, pages, below,
                                 self._tier_epoch())
            return (len(pages) + chain_length(below)) * self.page_size
        return len(pages) * self.page_size

    def _tier_chain(self, hashes: list, start: int, limit: int) -> list[tuple[int, list[int]]]:
        """The tier slots of the pages from `start` (the first the device lacks) that the
        tiers hold, in a chain up to `limit`, as runs (level, slots) (`tier_chain`): by units
        of several pages, the whole units before `limit` (a unit's key is its last page's),
        but for the pages the device holds of the first."""
        assert self.tiers is not None
        stores, unit = [tier.store for tier in self.tiers], self._tier_unit
        if unit == 1:
            return tier_chain(stores, hashes[start:limit])
        first = start // unit * unit
        units = tier_chain(stores, hashes[first + unit - 1 : limit // unit * unit : unit])
        runs = [(level, _slots(pages, unit)) for level, pages in units]
        if runs and start > first:  # the device holds the first unit's first pages
            runs[0] = (runs[0][0], runs[0][1][start - first :])
        return runs

    def _tier_epoch(self) -> int:
        assert self.tiers is not None
        return sum(tier.epoch for tier in self.tiers)

    def _num_lookup_pages(self, seq: Request) -> int:
        """Pages a lookup may hit: full, hashed, and leaving the last token to compute."""
        return min(len(seq.page_hashes(self.page_size)), (seq.num_tokens - 1) // self.page_size)

    def pages_needed_alone(self, seq: Request) -> int:
        """Pages the request holds at its largest with memory to itself: a request runs to its
        end whenever these fit in the cache (paging and buddy runs take exactly its length;
        a contiguous region takes what its reservation rule reserves)."""
        return -(-self._tokens_needed_alone(seq) // self.page_size)

    def explain_pages_needed(self, seq: Request) -> str:
        """Which rule sets `pages_needed_alone(seq)`, in words (for an error message)."""
        length = f"{seq.total_len} tokens: {seq.prompt_len} prompt + {seq.max_output_tokens} output"
        tokens = self._tokens_needed_alone(seq)
        if tokens > seq.total_len:
            return (
                f"contiguous allocation with reserve={self.policy.reserve} reserves {tokens} "
                f"tokens for this request of {length}"
            )
        return f"{length}, in pages of {self.page_size} tokens"

    def _tokens_needed_alone(self, seq: Request) -> int:
        if self.allocator.reserves_region:
            return max(seq.total_len, self._reserve(seq.total_len, self.max_model_len))
        return seq.total_len

    def usage(self) -> MemoryUsage:
        """A snapshot of device and host memory (O(1) for paged allocation)."""
        # (num_used_pages's sum, with each count read once: this runs once per step)
        free, cached = self.allocator.num_free_pages, len(self.evictor)
        used = self.num_total_pages - free - cached
        live = self._num_live_slots - self._num_dup_slots
        # Positional, in MemoryUsage's field order: keywords cost twice the whole call.
        return MemoryUsage(
            self.page_size,
            self.num_total_pages,
            used,  # num_used_pages
            cached,  # num_cached_free_pages
            free,  # num_free_pages
            live,  # num_live_token_slots
            used * self.page_size - live,  # num_internal_frag_slots
            self.allocator.num_unusable_free_pages(),  # num_external_frag_pages
            self.host.num_total_pages,
            self.host.num_used_pages,
            self.num_prefix_queries,
            self.num_prefix_hits,
        )

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
        state: _SeqState | None
        try:
            state = self._seqs[seq.request_id]
        except KeyError:
            state = None
        else:
            total = seq.num_computed_tokens + num_new_tokens
            if total <= state.fast_limit:  # the common decode step: no page boundary crossed
                if total > state.num_tokens:
                    self._num_live_slots += total - state.num_tokens
                    state.num_tokens = total
                return NO_OPS
            if self._free_list is not None and self._grow_by_one_page(state, total):
                return NO_OPS
        plan = self._plan(seq, num_new_tokens, state)
        if plan is None:
            return None
        if state is None and self.caching:
            self.num_prefix_queries += self._num_lookup_pages(seq)
            self.num_prefix_hits += len(plan.hit_pages)
            if self.store_threshold:
                self._count_reuse(seq, len(plan.hit_pages) + chain_length(plan.tier_hits or []))
            if self.tiers is not None:
                self._last_hit_levels = [len(plan.hit_pages), *([0] * len(self.tiers))]
                for level, slots in plan.tier_hits or ():
                    self._last_hit_levels[level] += len(slots)
        return self._execute(seq, seq.num_computed_tokens + num_new_tokens, state, plan)

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
        # Why: a step of a large batch is hundreds of decodes, nearly all of them a counter
        # update; one call for the run saves a Python call and the lookups per token, which is
        # most of the cost of a simulation.
        seqs, grow = self._seqs, self._grow_by_one_page if self._free_list is not None else None
        batch = requests[start : start + budget] if start or budget < len(requests) else requests
        num_claimed = adjust = 0  # live slots gained: one per claim, plus adjust
        for request in batch:
            done = request.num_computed_tokens
            if request.prompt_len + request.num_output_tokens - done != 1 or not done:
                break
            try:
                state = seqs[request.request_id]
            except KeyError:
                break
            if state.num_tokens == done < state.fast_limit:  # the slot is held: a counter update
                state.num_tokens = done + 1
            elif done < state.fast_limit:  # the token was claimed before (or more than it)
                claimed = max(done + 1, state.num_tokens)
                adjust += claimed - state.num_tokens - 1
                state.num_tokens = claimed
            elif grow is not None and grow(state, done + 1):
                adjust -= 1  # grow counted its token
            else:
                break
            num_claimed += 1
        self._num_live_slots += num_claimed + adjust
        return num_claimed

    def decode_run_ahead(self, requests: list[Request], max_steps: int) -> DecodeAhead | None:
        """How many steps (at most `max_steps`) of one decode token for each of `requests`
        take `allocate_decodes`' fast path only, none of them reaching its output length
        before the last: each request a plain decode (an output token already out) whose slot
        is unclaimed, with no page to register, copy or share ahead, and every page it fills
        next taken from the free list (no eviction). None when any request is not such a
        decode; otherwise the steps, with what `advance_decodes` and the caller's step
        records need (the requests' states, the sum and the largest of their computed tokens)
        so that no one walks the batch again for them."""
        free = self._free_list
        if free is None or max_steps <= 0 or self._through_keys:
            return None
        page_size, state_of = self.page_size, self._seqs.get
        steps, nearest = max_steps, max_steps  # nearest: the fewest steps to a page's end
        states: list[_SeqState] = []
        add_state = states.append
        sum_computed = max_computed = 0
        for request in reversed(requests):  # the newest first: the likeliest not to decode
            done = request.num_computed_tokens
            num_output = request.num_output_tokens
            state = state_of(request.request_id)
            # (no output yet: the last token of a prompt, a prefill that stamps a first token)
            if (request.prompt_len + num_output - done != 1 or not num_output
                    or state is None or state.hash_outputs or state.num_tokens != done):
                return None
            held = len(state.pages) * page_size
            if state.fast_limit != held:  # a page to register or a shared tail ahead
                return None
            if held - done < nearest:
                nearest = held - done
            if request.max_output_tokens - num_output < steps:
                steps = request.max_output_tokens - num_output
            sum_computed += done
            if done > max_computed:
                max_computed = done
            add_state(state)
        states.reverse()  # batch order, as `advance_decodes` takes the pages
        return DecodeAhead(self._steps_with_free_pages(states, steps, nearest), states,
                           sum_computed, max_computed)

    def _steps_with_free_pages(self, states: list[_SeqState], steps: int, nearest: int) -> int:
        """The first of `steps` decode steps of the sequences of `states` (plain decodes,
        each at least `nearest` steps from its pages' end) whose page the free list lacks;
        `steps` when it has them all."""
        page_size, free = self.page_size, self._free_list
        assert free is not None
        # Each sequence takes at most ceil(steps / page_size) pages in `steps` steps: count
        # them one by one only where the free list might run short.
        if nearest >= steps or len(states) * -(-steps // page_size) <= len(free):
            return steps
        crossings: list[int] = []  # for every page to take: the step that takes it
        for state in states:  # (a plain decode: num_tokens is its computed tokens)
            crossings += range(len(state.pages) * page_size - state.num_tokens, steps, page_size)
        if len(crossings) <= len(free):
            return steps
        crossings.sort()
        return crossings[len(free)]

    def advance_decodes(self, ahead: DecodeAhead, num_steps: int) -> list[int]:
        """Claim `num_steps` decode tokens for each sequence of `ahead` (`decode_run_ahead`
        must have allowed them, with nothing changed since), exactly as `num_steps` calls of
        `allocate_decodes` over the batch would, one step after another (the same pages in the
        same order). Returns the pages taken by the end of each step, cumulated. The caller
        commits the tokens."""
        assert num_steps <= ahead.num_steps, "more steps than decode_run_ahead allowed"
        page_size, free = self.page_size, self._free_list
        assert free is not None
        crossings: list[tuple[int, int, _SeqState]] = []  # (step, batch position, state) per page
        for index, state in enumerate(ahead.states):
            # (decode_run_ahead: num_tokens is the computed tokens, fast_limit the pages'
            # end) the step that fills its last page
            first = state.fast_limit - state.num_tokens
            if first < num_steps:
                crossings.append((first, index, state))
                if first + page_size < num_steps:  # (the usual run crosses one page end)
                    crossings += [(step, index, state)
                                  for step in range(first + page_size, num_steps, page_size)]
            state.num_tokens += num_steps
        crossings.sort()  # step by step, in batch order, as one by one (no two tie)
        taken = [0] * num_steps
        for step, _, state in crossings:
            state.pages.append(free.popleft())
            state.num_blocks += 1
            taken[step] += 1
        for _, _, state in crossings:  # the others' limit is still the end of their pages
            state.fast_limit = len(state.pages) * page_size
        self._num_live_slots += len(ahead.states) * num_steps
        return list(itertools.accumulate(taken))

    def free(self, seq: Request) -> None:
        """Release everything the sequence holds, on device and host."""
        state = self._seqs.get(seq.request_id)
        if state is not None:
            self._check_release(seq, state)
            del self._seqs[seq.request_id]
            if seq.request_id in self._step_loaded:
                self._step_freed.append((seq, state, seq.num_computed_tokens))
            else:
                self._release(seq, state)
        self.host.release(seq.request_id)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix and free its pages (vLLM's reset_prefix_cache), recorded
        as one cleared event; only while no sequence holds memory: False (nothing changed)
        otherwise."""
        if self._seqs or self.host.num_used_pages:
            return False
        events, self.events = self.events, None  # one cleared event, not one per page
        tiers, self.tiers = self.tiers, None  # forgotten, not written below
        try:
            self._evict(len(self.evictor))
        finally:
            self.events, self.tiers = events, tiers
        assert not self._cached, "a cached prefix outlived its pages"
        for tier in tiers or ():
            tier.clear()
        self._through_pages, self._through_keys = [], []
        self._last_lookup = None
        if events is not None:
            events.cleared()
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """Share the parent's filled pages with `child` (copy-on-write: a write copies first).

        The child carries the parent's tokens so far (the same prompt, and the same output ids
        where they are known)."""
        assert child.request_id not in self._seqs, "child already holds memory"
        src = self._seqs[parent.request_id]
        if parent.request_id in self._step_new:
            raise StepOrderError(f"fork of request {parent.request_id}: it was given memory in "
                                 "this step; fork a parent whose KV is all written")
        if src.num_tokens != parent.num_computed_tokens:
            raise StepOrderError(
                f"fork of request {parent.request_id}: it has claimed {src.num_tokens} tokens "
                f"and computed {parent.num_computed_tokens}; fork a parent whose KV is all "
                "written")
        num_filled = -(-src.num_tokens // self.page_size)
        pages = src.pages[:num_filled]
        owners = self._owners
        for index, page in enumerate(pages):
            owners[page] = owners.get(page, 1) + 1
            self._num_dup_slots += self._fill(index, src.num_tokens)
        # Both sides must take the slow path before writing into the shared last page.
        src.fast_limit = min(src.fast_limit, src.num_tokens)
        src.regular = False  # the child may register pages the parent holds, and vice versa
        hashes = child.page_hashes(self.page_size) if self.caching else []
        self._seqs[child.request_id] = _SeqState(
            list(pages), src.num_tokens, src.num_tokens, src.num_blocks,
            min(src.num_hashed, len(hashes)), hashes, False, 0, self._hashes_outputs(child),
        )
        self._num_live_slots += src.num_tokens
        if self._in_step:
            self._step_new.add(child.request_id)

    def _check_release(self, seq: Request, state: _SeqState) -> None:
        """Raise StepOrderError where releasing `seq` now would leave another table holding
        pages it registered but has not computed (taken as prefix hits in this step)."""
        page_size, owners = self.page_size, self._owners
        num_written = seq.num_computed_tokens
        if not owners or state.num_hashed * page_size <= num_written:
            return
        unwritten = state.pages[num_written // page_size : state.num_hashed]
        if any(page in owners for page in unwritten):
            raise StepOrderError(
                f"request {seq.request_id} is released with pages that others took as prefix "
                "hits before it computed them; release it only after the step that computes "
                "them (or before another request hits them)")

    # ----------------------------------------------------------------------------- tiers

    def begin_step(self) -> None:
        """A step's decisions start (see the class's rules): write through the pages
        registered by the step before (their KV is computed now)."""
        self._in_step = True
        if self._through_keys:
            self._write_through()

    def end_step(self, ops: MemOps) -> None:
        """A step's decisions are made: append its tier writes to `ops` (in the order they
        were decided) and release the tier pages its loads read and the host pages its
        swap-ins read."""
        # (every step of every run: the common step, no tiers and nothing new, is three tests)
        if self.tiers is not None:
            self._flush_write_backs()
            if self._tier_writes:
                ops.tier_writes.extend(self._tier_writes)
                self._tier_writes = []
            for tier in self.tiers:
                tier.unpin_all()
        if self._step_copies:
            self._step_copies.clear()
        if self._step_new:  # (swapped-in and loaded requests, freed or not, are among these)
            self.host.free_held()
            self._step_new.clear()
            self._step_loaded.clear()
            for seq, state, num_written in self._step_freed:
                self._release(seq, state, num_written)
            self._step_freed = []
        self._in_step = False

    def _write_through(self) -> None:
        """Store the pages registered by the step before in the first tier, unless their
        content left the device since (a unit of several pages: unless any of its pages'
        did), each key once (two tables may register one key in a step: the first freed
        before computing it, the second given the same pages)."""
        pages, keys = self._through_pages, self._through_keys
        self._through_pages, self._through_keys = [], []
        assert self.tiers is not None
        unit = self._tier_unit
        found = list(map(self._cached.get, keys))
        if found != pages:  # some content left the device (the common case: none did)
            live = _whole([page == held for page, held in zip(pages, found, strict=True)], unit)
            pages, keys = list(compress(pages, live)), list(compress(keys, live))
        unit_keys = keys[unit - 1 :: unit]
        if len(set(unit_keys)) < len(unit_keys):
            first: dict = {}  # key -> the index of its first unit
            for index, key in enumerate(unit_keys):
                first.setdefault(key, index)
            keep = [first[key] == index for index, key in enumerate(unit_keys)]
            pages = list(compress(pages, _each_page(keep, unit)))
            unit_keys = list(compress(unit_keys, keep))
        if unit_keys:
            self._store(0, pages, unit_keys, 1)

    def count_first_hits(self) -> None:
        """The sequence just allocated is at its first admission: add its hits, level by
        level, to `first_hit_pages` (the basis of `Request.num_cached_tokens`)."""
        for level, pages in enumerate(self._last_hit_levels):
            self.first_hit_pages[level] += pages
        self._last_hit_levels = []

    def check_tiers(self, *, distinct: bool = True) -> None:
        """Conservation in every tier (AssertionError otherwise); nothing pinned between steps.
        `distinct`: also that no two keys share a tier page (`PrefixTier.check`)."""
        for tier in self.tiers or ():
            tier.check(distinct=distinct)
            assert not tier.num_pinned_pages, f"{tier.kind} tier pages left pinned"

    def _pin_tier_hits(self, seq: Request, start: int,
                       hits: list[tuple[int, list[int]]]) -> None:
        """Pin the tier pages of `seq`'s hits below the device (runs of tier slots), its pages
        `start` onwards (a unit of several pages: pinned, and counted, whole)."""
        assert self.tiers is not None
        unit, hashes = self._tier_unit, seq.page_hashes(self.page_size)
        for level, slots in hits:
            if unit == 1:
                pages, keys = slots, hashes[start : start + len(slots)]
            else:  # a unit where the run starts, then every `unit` slots; its key its last page's
                firsts = [0, *range(unit - slots[0] % unit, len(slots), unit)]
                keys = [hashes[(start + offset) // unit * unit + unit - 1] for offset in firsts]
                pages = [slots[offset] // unit for offset in firsts]
            self.tiers[level - 1].pin_many(pages, keys)
            self.tier_stats[level - 1].num_hits += len(pages) * unit
            start += len(slots)

    def _received(self, state: _SeqState, plan: _Plan) -> MemOps:
        """What fills a new sequence's pages after its device hits (the plan took them): the
        loads of its hits below the device, then the pages another instance sends."""
        hits, start = plan.tier_hits or [], state.num_hit_pages
        num_hits = chain_length(hits)
        pages = state.pages[start : start + num_hits]
        start += num_hits
        return MemOps(tier_loads=[TierBatch(level, sources, 0, destinations)
                                  for level, (sources, destinations)
                                  in _by_level(hits, pages).items()],
                      transfer_ins=state.pages[start : start + plan.num_transfer_pages])

    def _write_back(self, pages: list[int], keys: list) -> None:
        """Device pages whose content is being dropped: store what the first tier lacks (in a
        batch, soon: the pages keep their content until the step's work runs)."""
        pending_pages, pending_keys = self._write_backs
        pending_pages += pages
        pending_keys += keys

    def _flush_write_backs(self) -> None:
        pages, keys = self._write_backs
        if pages:
            self._write_backs = ([], [])
            self._store(0, pages, keys, 1)

    def _store(self, src_level: int, src_pages: list[int], keys: list, level: int) -> None:
        """Write `keys` (held by `src_pages` of `src_level`, a unit of `_tier_unit` pages
        each, in order) to tier `level`, skipping what it holds already (and, from the device,
        what was not hit often enough); the pages they take there, where they held other
        content, first move it to the next tier. A tier whose pages are all read by loads of
        this step skips the write."""
        tiers, unit = self.tiers, self._tier_unit
        assert tiers is not None
        tier = tiers[level - 1]
        # Keys are unique here (one device page per key, one tier page per key); the common
        # case, none of them held below yet, is checked in C.
        own = self.tier_stats[level - 1]
        if src_level == 0 and self.store_threshold:
            threshold, reuse = self.store_threshold, self._reuse
            keep = [not held and reuse.get(key, 0) >= threshold
                    for key, held in zip(keys, tier.store.holds_each(keys), strict=True)]
            keys = list(compress(keys, keep))
            src_pages = list(compress(src_pages, _each_page(keep, unit)))
        elif len(keys) <= tier.num_free_pages:  # room for all: found and stored in one pass
            stored_keys, pages = tier.put_into_free(keys)
            if stored_keys is not None:
                src_pages = list(compress(src_pages, _each_page(stored_keys, unit)))
            own.num_stores += len(pages) * unit
            if pages:  # (a row of free pages: one range of slots)
                slots = pages if unit == 1 else range(pages[0] * unit, (pages[-1] + 1) * unit)
                self._tier_writes.append(TierBatch(src_level, src_pages, level, slots))
            return
        elif tier.store.holds_any(keys):
            keep = [not held for held in tier.store.holds_each(keys)]
            keys = list(compress(keys, keep))
            src_pages = list(compress(src_pages, _each_page(keep, unit)))
        if not keys:
            return
        stored, pages, victim_pages, victim_keys = tier.put_many(keys)
        own.num_stores += len(stored) * unit
        own.num_evictions += len(victim_keys) * unit
        victim_slots = _slots(victim_pages, unit)
        if victim_keys and level < len(tiers):
            tier.stats.num_demotions += len(victim_keys) * unit
            own.num_demotions += len(victim_keys) * unit
            self._store(level, victim_slots, victim_keys, level + 1)
        sources = src_pages[len(src_pages) - len(stored) * unit :]  # put_many keeps the last
        # a full tier's victims' pages take the keys: their slots listed once (batches are read)
        slots = victim_slots if unit > 1 and pages == victim_pages else _slots(pages, unit)
        self._tier_writes.append(TierBatch(src_level, sources, level, slots))

    def _count_reuse(self, seq: Request, num_hit_pages: int) -> None:
        reuse = self._reuse
        for key in seq.page_hashes(self.page_size)[:num_hit_pages]:
            reuse[key] = reuse.get(key, 0) + 1

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
        if seq.request_id not in self._seqs or seq.request_id in self._step_new:
            return False
        return self.host.can_store(-(-seq.num_computed_tokens // self.page_size))

    def swap_out(self, seq: Request) -> MemOps:
        """Copy the pages of the computed tokens to host memory and release all device pages
        (a page copied on write in this step is read from the copy's source: swap-outs run
        before copies)."""
        assert seq.request_id not in self._step_new, "call can_swap_out first"
        state = self._seqs[seq.request_id]
        self._check_release(seq, state)
        del self._seqs[seq.request_id]
        num_tokens = seq.num_computed_tokens
        num_filled = -(-num_tokens // self.page_size)
        assert self.host.can_store(num_filled), "call can_swap_out first"
        host_pages = self.host.store(seq.request_id, num_filled, num_tokens)
        pages = state.pages[:num_filled]
        if self._step_copies:
            copies = self._step_copies
            pages = [copies.get(page, page) for page in pages]
        ops = MemOps(swap_outs=list(zip(pages, host_pages, strict=True)))
        self._release(seq, state)
        return ops

    def can_swap_in(self, seq: Request) -> bool:
        """Whether device memory has room to bring the sequence back, keeping the watermark free
        (as vLLM v0 did): without it a swapped-in request preempts another at its next page."""
        stored = self.host.stored(seq.request_id)
        return stored is not None and self._plan_new(seq, stored[1], [], watermark=True) is not None

    def swap_in(self, seq: Request) -> MemOps | None:
        """Bring the sequence's pages back from host memory; None when device memory is short."""
        stored = self.host.stored(seq.request_id)
        assert stored is not None, "swap_in of a sequence not swapped out"
        host_pages, num_tokens = stored
        plan = self._plan_new(seq, num_tokens, [], watermark=True)
        if plan is None:
            return None
        self.host.release(seq.request_id, hold=self._in_step)
        self._execute(seq, num_tokens, None, plan)
        if self._in_step:
            self._step_loaded.add(seq.request_id)
        pages = self._seqs[seq.request_id].pages
        return MemOps(swap_ins=list(zip(host_pages, pages[: len(host_pages)], strict=True)))

    # ----------------------------------------------------------------------------- internals

    def _grow_by_one_page(self, state: _SeqState, total: int) -> bool:
        """The decode step that crosses a page boundary under paged, fixed-size blocks: take the
        next free page directly (the hot path of every simulation); False defers to the planner."""
        page_size = self.page_size
        limit = state.fast_limit
        free = self._free_list
        if total > limit + page_size or limit != len(state.pages) * page_size:
            return False
        # A limit at the table's end means every held page is registered (or has no hash), so
        # the new page is the next to register when it has a hash: the allocation that fills
        # it takes the planner, which registers it in the step that fills it (a chunk of one
        # whole page, a decode at page size 1), and the fast path stops short of its end.
        to_register = state.hash_outputs or state.num_hashed < len(state.hashes)
        if to_register and total == limit + page_size:
            return False
        if free:
            page = free.popleft()
        else:
            # What _evict(1) would release to the empty free list and we would pop right back.
            try:
                page, key = self.evictor.pop_victim()
            except LookupError:  # nothing cached either
                return False
            del self._cached[key]
            self._cache_epoch += 1
            if self.events is not None:
                self.events.removed([key])
            if self.tiers is not None and self._tier_unit == 1:  # (units: written through)
                self._write_back([page], [key])
        state.pages.append(page)
        state.num_blocks += 1
        state.fast_limit = limit + page_size - to_register  # (see `_fast_limit`)
        self._num_live_slots += total - state.num_tokens
        state.num_tokens = total
        return True

    def _plan(self, seq: Request, num_new_tokens: int, state: _SeqState | None) -> _Plan | None:
        total = seq.num_computed_tokens + num_new_tokens
        if state is None:
            hits, below, num_transfer = self._hit_pages(seq)
            plan = self._plan_new(seq, total, hits, watermark=True)
            if plan is not None:
                plan.tier_hits = below or None
                plan.num_transfer_pages = num_transfer
            return plan
        return self._plan_growth(seq, total, state)

    def _hit_pages(self, seq: Request) -> tuple[list[int], list[tuple[int, list[int]]], int]:
        """The cached pages a new sequence starts from, on the device and below it (runs of
        tier slots, `_tier_chain`), and how many pages after them another instance sends: its
        `num_computed_tokens`, looked up again unless the last lookup was this sequence's and
        no key has left the cache (or a tier) since; tokens past the hit may be computed only
        as far as its `kv_transfer_tokens`."""
        num_computed = seq.num_computed_tokens
        if not num_computed:
            return [], [], 0
        last = self._last_lookup
        if not self.caching:
            last = (seq.request_id, self._cache_epoch, [])
        elif (last is None or last[0] != seq.request_id or last[1] != self._cache_epoch
                or (len(last) > 3 and last[4] != self._tier_epoch())):
            self.num_computed_prefix_tokens(seq)
            last = self._last_lookup
            assert last is not None
        pages, below = last[2], last[3] if len(last) > 3 else []
        num_pages, partial = divmod(num_computed, self.page_size)
        num_hit = len(pages) + chain_length(below)
        if seq.kv_transfer_tokens and num_computed > num_hit * self.page_size:
            if num_computed > seq.kv_transfer_tokens:
                raise ValueError(
                    f"request {seq.request_id}: num_computed_tokens is {num_computed}, past "
                    f"its {seq.kv_transfer_tokens} transferred tokens")
            return pages, below, -(-num_computed // self.page_size) - num_hit
        if partial or num_pages > num_hit:
            # Raised, not asserted: under `python -O` the pages would be shared with a
            # sequence whose content differs.
            raise ValueError(
                f"request {seq.request_id}: num_computed_tokens is {num_computed}, but the "
                f"prefix cache holds {num_hit * self.page_size} of its "
                "tokens now (whole pages); set it from num_computed_prefix_tokens() (or to 0) "
                "just before allocate"
            )
        return pages[:num_pages], chain_head(below, num_pages - len(pages)), 0

    def _plan_new(
        self, seq: Request, total: int, hits: list[int], *, watermark: bool
    ) -> _Plan | None:
        page_size = self.page_size
        alone, allocator = self.num_used_pages == 0, self.allocator
        if allocator.reserves_region:
            reserved = max(total, self._reserve(seq.total_len, self.max_model_len))
            needed = -(-reserved // page_size) - len(hits)
        else:
            needed = self._block_pages(seq, total, 0, len(hits))
        fits = self._fits(needed, hits, self.watermark_pages if watermark and not alone else 0)
        # Alone in buddy memory, a request takes its whole length as power-of-two runs when its
        # own block would not fit (a prompt block rounded up past the memory), or when it was
        # preempted before: its own smaller blocks could fragment memory so that it could
        # never grow alone (a livelock). So whatever fits alone runs to its end.
        runs = allocator.free_list is None and not allocator.reserves_region
        if alone and runs and (seq.num_preemptions or not fits):
            whole = -(-max(total, seq.total_len) // page_size) - len(hits)
            return _Plan(hits, whole, False, as_runs=True) if self._fits_as_runs(
                whole, hits
            ) else None
        return _Plan(hits, needed, False) if fits else None

    def _plan_growth(self, seq: Request, total: int, state: _SeqState) -> _Plan | None:
        page_size = self.page_size
        cow = bool(
            state.num_tokens % page_size
            and total > state.num_tokens
            and state.pages[state.num_tokens // page_size] in self._owners
        )
        if self.allocator.reserves_region:  # a region grows only by another region elsewhere
            needed = max(0, -(-total // page_size) - len(state.pages))
        else:
            needed = self._block_pages(seq, total, state.num_blocks, len(state.pages))
        # The copy of a shared last page is the first page of the new block: one allocation.
        needed += cow
        if not self._fits(needed, [], 0):
            return None
        return _Plan([], needed, cow)

    def _block_pages(self, seq: Request, total: int, num_blocks: int, num_held: int) -> int:
        """Pages of the next block: what the block-sizing policy asks, never past the request's
        largest possible length (so a request that fits alone always fits)."""
        page_size = self.page_size
        needed = -(-total // page_size) - num_held
        if needed <= 0:
            return 0
        wanted = self.block_sizing.pages_for_next_block(seq, num_blocks, needed)
        ceiling = -(-max(total, seq.total_len) // page_size) - num_held
        return max(needed, min(wanted, ceiling))

    def _fits_as_runs(self, num_pages: int, hits: list[int]) -> bool:
        """Whether `num_pages` pages in runs of any power-of-two size can be taken: any free
        or evictable page will do, but the hits stop being evictable."""
        evictor = self.evictor
        num_hits_cached = sum(1 for page in hits if page in evictor)
        return num_pages <= self.allocator.num_free_pages + len(evictor) - num_hits_cached

    def _fits(self, num_pages: int, hits: list[int], reserve: int) -> bool:
        """Whether `num_pages` (as one block) can be taken, evicting cached pages if needed."""
        if num_pages <= 0:
            return True
        evictor = self.evictor
        take = self.allocator.pages_for(num_pages)
        available = self.allocator.num_free_pages + len(evictor)
        if hits and take + reserve > available - len(hits):  # only then can the hits matter
            available -= sum(1 for page in hits if page in evictor)  # they stop being cached
        if take + reserve > available:
            return False
        if self.allocator.free_list is not None or self.allocator.can_allocate(num_pages):
            return True
        if not len(evictor):
            return False
        hit_set = set(hits)
        evictable = [page for page in evictor.pages() if page not in hit_set]
        return self.allocator.can_allocate(num_pages, evictable)

    def _execute(self, seq: Request, total: int, state: _SeqState | None, plan: _Plan) -> MemOps:
        ops = NO_OPS
        if state is None:
            if plan.tier_hits:
                self._pin_tier_hits(seq, len(plan.hit_pages), plan.tier_hits)
            state = self._take_hits(seq, plan.hit_pages)
            if self._in_step:
                self._step_new.add(seq.request_id)
        if plan.as_runs:
            state.pages += self._take_runs(plan.num_block_pages)
            state.num_blocks += 1
        elif plan.num_block_pages:
            block = self._take_block(plan.num_block_pages)
            if plan.cow:  # copy the shared, partly filled last page into the block's first page
                index = state.num_tokens // self.page_size
                old = state.pages[index]
                ops = MemOps(copies=[(old, block[0])])
                if self._in_step:  # (a copy of a copy made this step reads the first source)
                    self._step_copies[block[0]] = self._step_copies.get(old, old)
                self._drop_owner(old)
                self._num_dup_slots -= self._fill(index, state.num_tokens)
                state.pages[index] = block[0]
                block = block[1:]
            state.pages.extend(block)
            state.num_blocks += 1
        if plan.tier_hits or plan.num_transfer_pages:
            ops = self._received(state, plan)
            if self._in_step:
                self._step_loaded.add(seq.request_id)
        if total > state.num_tokens:
            self._num_live_slots += total - state.num_tokens
            state.num_tokens = total
        self._register(seq, state, state.num_tokens)
        state.fast_limit = self._fast_limit(state)
        return ops

    def _take_hits(self, seq: Request, hits: list[int]) -> _SeqState:
        owners, evictor = self._owners, self.evictor
        num_shared = 0  # hits on pages other sequences hold
        for page in hits:
            count = owners.get(page)
            if count is not None:
                owners[page] = count + 1
                num_shared += 1
            elif page in evictor:
                evictor.remove(page)
            else:
                owners[page] = 2
                num_shared += 1
            evictor.on_hit(page)
        self._num_dup_slots += num_shared * self.page_size
        self._last_lookup = None
        hashes = seq.page_hashes(self.page_size) if self.caching else []
        state = _SeqState(list(hits), 0, 0, 0, len(hits), hashes, True, len(hits))
        state.hash_outputs = self._hashes_outputs(seq)
        self._seqs[seq.request_id] = state
        self._num_live_slots += len(hits) * self.page_size
        state.num_tokens = len(hits) * self.page_size
        return state

    def _take_block(self, num_pages: int) -> list[int]:
        """Take one block, evicting cached pages as needed (the plan made sure it fits)."""
        allocator = self.allocator
        free = allocator.free_list
        if free is not None and num_pages > len(free):
            # Paging takes the free list from its head: all of it, then the evicted pages in
            # eviction order (what releasing them to its tail and allocating would give).
            pages = list(free)
            free.clear()
            return pages + self._drop_victims(num_pages - len(pages))
        block = allocator.allocate(num_pages)
        while block is None:  # a run that fits only once cached pages are evicted
            self._evict(1)
            block = allocator.allocate(num_pages)
        return block

    def _take_runs(self, num_pages: int) -> list[int]:
        """`num_pages` pages as power-of-two runs, largest first (the binary digits of the
        count), evicting cached pages as needed; a run no free block holds, with nothing left
        to evict, is taken as two halves (the plan made sure the pages exist)."""
        allocator, pages = self.allocator, []
        sizes = [1 << bit for bit in range(num_pages.bit_length()) if num_pages >> bit & 1]
        while sizes:
            size = sizes.pop()  # the largest left; halves pushed below stay in order
            run = allocator.allocate(size)
            while run is None and len(self.evictor):
                self._evict(1)
                run = allocator.allocate(size)
            if run is None:
                assert size > 1, "the plan counted more free pages than there are"
                sizes += [size >> 1, size >> 1]
            else:
                pages += run
        return pages

    def _evict(self, num_pages: int) -> None:
        """Drop the content of `num_pages` cached pages, in eviction order, and free them."""
        self.allocator.release(self._drop_victims(num_pages))

    def _drop_victims(self, num_pages: int) -> list[int]:
        """Take `num_pages` cached pages from the eviction policy, in its order, and forget their
        content; the caller frees or reuses them."""
        pages, keys = pop_victims(self.evictor, num_pages)
        # A C loop: about 1.3M evictions in a trace-long run, 55 ns each less than `del` in a
        # Python loop here.
        deque(map(self._cached.pop, keys), maxlen=0)
        self._cache_epoch += 1
        if self.events is not None:
            self.events.removed(keys)
        if self.tiers is not None and self._tier_unit == 1:  # (units: written through)
            self._write_back(pages, keys)
        return pages

    def _hashes_outputs(self, seq: Request) -> bool:
        return self.caching and seq.output_ids_known and seq.prompt_token_ids is not None

    def _register(self, seq: Request, state: _SeqState, num_tokens: int) -> None:
        """Put the pages that the first `num_tokens` tokens fill into the prefix cache (prompt
        pages, and output pages of a state hashing outputs)."""
        if state.hash_outputs:
            state.hashes = seq.page_hashes(self.page_size)  # hashes the outputs known so far
        start, hashes = state.num_hashed, state.hashes
        num_full = min(len(hashes), num_tokens // self.page_size)
        if num_full <= start:
            return
        cached = self._cached
        keys, pages = hashes[start:num_full], state.pages[start:num_full]
        if cached.keys().isdisjoint(keys):  # the common case, in C
            cached.update(zip(keys, pages, strict=True))
            new: range | list[int] = range(start, num_full)
        else:  # some content is already cached in another page: keep that page
            # (one page per key, unlike vLLM, which caches duplicates: once that page is
            # evicted, this one stays uncached while held, and vLLM would still hit it)
            state.regular = False
            indices: list[int] = []  # the pages whose content was not cached yet
            for index in range(start, num_full):
                if hashes[index] not in cached:
                    cached[hashes[index]] = state.pages[index]
                    indices.append(index)
            new = indices
        state.num_hashed = num_full
        if self.events is not None:
            self._record_stored(seq, hashes, new)
        if self.write_through and self.tiers is not None:
            self._queue_through(state, new, start, num_full)

    def _queue_through(self, state: _SeqState, new: range | list[int], start: int,
                       num_full: int) -> None:
        """Queue for writing through the pages `_register` just put in the cache (`new`, of
        pages `start` to `num_full`): with units of several pages, each unit whose last page
        is among them (so a unit is queued once, by the table registering its key), from the
        device pages holding its content (a unit whose pages are not all on the device is
        not written)."""
        unit, hashes = self._tier_unit, state.hashes
        if unit == 1:
            pages = state.pages
            self._through_pages += [pages[index] for index in new]
            self._through_keys += [hashes[index] for index in new]
            return
        first, end = start // unit * unit, num_full // unit * unit  # the units completed
        if first >= end:
            return
        if isinstance(new, range):  # every page new
            keys = hashes[first:end]
            # a regular table's pages hold its registered content (none cached elsewhere)
            held = state.pages[first:end] if state.regular else list(map(self._cached.get, keys))
        else:  # only units whose last page is new here: another table queued the others
            fresh = set(new)
            starts = [index for index in range(first, end, unit) if index + unit - 1 in fresh]
            keys = list(chain.from_iterable(hashes[index : index + unit] for index in starts))
            held = list(map(self._cached.get, keys))
        if None in held:
            whole = _whole([page is not None for page in held], unit)
            keys, held = list(compress(keys, whole)), list(compress(held, whole))
        self._through_pages += cast("list[int]", held)
        self._through_keys += keys

    def _record_stored(self, seq: Request, hashes: list, indices: range | list[int]) -> None:
        """Stored events for the pages at `indices` of `seq`'s table, just registered."""
        assert self.events is not None
        page_size, has_ids = self.page_size, seq.prompt_token_ids is not None
        for index in indices:
            ids = seq.token_slice(index * page_size, (index + 1) * page_size) if has_ids else None
            self.events.stored(hashes[index], seq.request_id, hashes[index - 1] if index else None,
                               None if ids is None else tuple(ids))

    def _fast_limit(self, state: _SeqState) -> int:
        page_size = self.page_size
        limit = len(state.pages) * page_size
        if state.num_tokens % page_size:
            tail = state.pages[state.num_tokens // page_size]
            if tail in self._owners:  # shared partial page: the next write copies it
                return state.num_tokens
        if state.hash_outputs or state.num_hashed < len(state.hashes):
            # Stop where the next page to register fills: the allocation that fills it takes
            # the slow path and registers it, in the step that computes its last token (vLLM).
            limit = min(limit, (state.num_hashed + 1) * page_size - 1)
        return limit

    def _unregister_unwritten(self, state: _SeqState, num_written: int) -> None:
        """Take out of the prefix cache the registered pages past the first `num_written`
        tokens: a sequence preempted in the step that registered them never computes them."""
        num_full, cached = num_written // self.page_size, self._cached
        removed = []
        for index in range(num_full, state.num_hashed):
            key = state.hashes[index]
            if cached.get(key) == state.pages[index]:
                del cached[key]
                removed.append(key)
        state.num_hashed = num_full
        if self.events is not None:
            self.events.removed(removed)
        self._cache_epoch += 1

    def _release(self, seq: Request, state: _SeqState, num_written: int | None = None) -> None:
        """Drop one owner from each page. Pages left with none are cached if registered, tail
        first (so LRU evicts deep prompt pages before the roots they hang from), else freed in
        table order. Only the KV of `num_written` tokens (default `seq.num_computed_tokens`)
        was written: pages registered past them are taken out of the cache, and pages they
        fill are put in."""
        if num_written is None:
            num_written = seq.num_computed_tokens
        if state.hash_outputs:
            self._register(seq, state, min(num_written, state.num_tokens))
        if state.num_hashed * self.page_size > num_written:
            self._unregister_unwritten(state, num_written)
        pages, end, owners = state.pages, state.num_hashed, self._owners
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
        add_cached(self.evictor, to_cache, keys, depths)
        self.allocator.release(to_free)
        self._num_live_slots -= state.num_tokens

    def _shared_pages_of_regular(self, state: _SeqState) -> tuple[int | None, set[int] | None]:
        """The pages of a regular table that other tables hold: (k, None) when they are its
        first k pages (the common case), else (None, the set of them).

        Only registered pages can be in another table, and they are full. They are any of its
        own prefix hits (a hit may take pages from several tables, whose other owners leave
        one by one), and the run after them that later requests hit: a hit on page j of this
        table takes every page before it too."""
        pages, owners, num_hits = state.pages, self._owners, state.num_hit_pages
        hits = pages[:num_hits]
        num_held = sum(map(owners.__contains__, hits)) if num_hits else 0  # a C loop
        run, end = num_hits, state.num_hashed
        while run < end and pages[run] in owners:
            run += 1
        if num_held == num_hits:
            return run, None
        return None, {page for page in hits if page in owners} | set(pages[num_hits:run])

    def _sort_released(
        self, state: _SeqState, still_held: set[int]
    ) -> tuple[list[int], list, list[int], list[int]]:
        """The general case of `_release`: (registered pages tail first, their hashes, their
        depths, the other pages in table order), leaving out the pages still held."""
        cached, hashes = self._cached, state.hashes
        to_cache, keys, depths, to_free = [], [], [], []
        for index, page in enumerate(state.pages):
            if page in still_held:
                continue
            if index < len(hashes) and cached.get(hashes[index]) == page:
                to_cache.append(page)
                keys.append(hashes[index])
                depths.append(index)
            else:
                to_free.append(page)
        return to_cache[::-1], keys[::-1], depths[::-1], to_free

    def _unshare(self, state: _SeqState, shared: set[int], *, full: bool) -> None:
        """Drop this sequence from the owners of its `shared` pages (`full`: every one of them
        is a full page of its table)."""
        if full:
            self._num_dup_slots -= len(shared) * self.page_size
        else:
            self._num_dup_slots -= sum(
                self._fill(index, state.num_tokens)
                for index, page in enumerate(state.pages)
                if page in shared
            )
        for page in shared:
            self._drop_owner(page)

    def _drop_owner(self, page: int) -> None:
        """One of the owners of a shared page lets it go (the page stays held)."""
        count = self._owners[page]
        if count > 2:
            self._owners[page] = count - 1
        else:
            del self._owners[page]

    def _fill(self, index: int, num_tokens: int) -> int:
        """Tokens held in page `index` of a sequence of `num_tokens` tokens."""
        return max(0, min(self.page_size, num_tokens - index * self.page_size))


def _each_page(flags: list[bool], unit: int) -> list[bool]:
    """A flag per unit as a flag per page, `unit` pages a unit."""
    if unit == 1:
        return flags
    return [flag for flag in flags for _ in range(unit)]


def _whole(flags: list[bool], unit: int) -> list[bool]:
    """A flag per page, `unit` pages a unit: true where all of its unit's are."""
    if unit == 1:
        return flags
    return _each_page([all(flags[start : start + unit])
                       for start in range(0, len(flags), unit)], unit)


def _slots(tier_pages: list[int], unit: int) -> list[int]:
    """The device-page slots of tier pages of `unit` device pages each, in order."""
    if unit == 1:
        return tier_pages
    starts = [page * unit for page in tier_pages]  # then a range each, in C
    return list(chain.from_iterable(map(range, starts, map(unit.__add__, starts))))


def _by_level(hits: list[tuple[int, list[int]]], values: list) -> dict[int, tuple[list[int], list]]:
    """Tier hits as runs `(level, tier slots)`, with a value per slot, grouped by level:
    (tier slots, values), in order."""
    grouped: dict[int, tuple[list[int], list]] = {}
    start = 0
    for level, slots in hits:
        level_slots, level_values = grouped.setdefault(level, ([], []))
        level_slots += slots
        level_values += values[start : start + len(slots)]
        start += len(slots)
    assert start == len(values), "one value per hit"
    return grouped
