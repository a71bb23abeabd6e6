"""Full attention's block tables: every token's KV kept, prefix pages registered and shared."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.policies import registry
from kvlab.policies.groups.release import TableRelease
from kvlab.policies.groups.table import Plan, SeqState
from kvlab.policies.interfaces import BlockSizing, ReserveRule
from kvlab.policies.outputs import MemOps
from kvlab.policies.request import Request
from kvlab.policies.spec import PolicySpec
from kvlab.specs.kv_groups import NULL_PAGE

if TYPE_CHECKING:
    from kvlab.policies.page_pool import PagePool
    from kvlab.policies.tier_link import TierLink

# Returned when a decision needs no physical work. Shared: callers must never mutate a MemOps
# they get from the manager (the scheduler copies them into its own per-step MemOps).
NO_OPS = MemOps()


class FullAttentionManager(TableRelease):
    """The block tables of one full-attention group (vLLM's `FullAttentionManager`): plans and
    takes blocks from the page pool under the allocation and block-sizing policies, registers
    full pages in the prefix cache, shares pages on prefix hits and forks, and releases them.

    `seqs` maps a request id to its `SeqState`; `num_live_slots - num_dup_slots` are the token
    slots holding KV (a shared page's tokens counted once).
    """

    __slots__ = (
        "_reserve",
        "block_sizing",
        "caching",
        "free_list",
        "max_model_len",
        "page_size",
        "policy",
        "pool",
        "seqs",
        "tiers",
        "watermark_pages",
    )

    def __init__(self, policy: PolicySpec, pool: PagePool, *, max_model_len: int) -> None:
        self.policy = policy
        self.pool = pool
        self.page_size = policy.block_size
        self.max_model_len = max_model_len
        self.block_sizing: BlockSizing = registry.get(
            "block_sizing", policy.block_sizing).factory(self.page_size)
        self._reserve: ReserveRule = registry.get("reserve", policy.reserve).factory
        self.caching: bool = pool.evictor.caches
        self.free_list = pool.free_list
        self.watermark_pages = int(policy.watermark * pool.num_total_pages)
        self.seqs: dict[int, SeqState] = {}
        self.num_live_slots = 0  # sum of claimed tokens over sequences...
        self.num_dup_slots = 0  # ...minus this: tokens counted twice because a page is shared
        self.tiers: TierLink | None = None  # set by the manager when it has tiers

    # ----------------------------------------------------------------------------- sizing

    def tokens_needed_alone(self, seq: Request) -> int:
        """Token slots the request holds at its largest with memory to itself."""
        if self.pool.allocator.reserves_region:
            return max(seq.total_len, self._reserve(seq.total_len, self.max_model_len))
        return seq.total_len

    def pages_to_add(self, num_held: int, total: int) -> int:
        """Pages a table of `num_held` pages takes to hold `total` tokens, one page at a time."""
        return max(0, -(-total // self.page_size) - num_held)

    def pages_to_start(self, seq: Request, total: int, num_hits: int) -> int:
        """Pages a new sequence's table takes after its `num_hits` hit pages to hold `total`
        tokens (what the hybrid manager asks of each group)."""
        return self.new_block_pages(seq, total, num_hits)

    def pages_to_grow(self, seq: Request, total: int, state: SeqState) -> int:
        """Pages a held sequence's table takes to hold `total` tokens, the copy of a shared
        last page first (what the hybrid manager asks of each group)."""
        return self.growth_pages(seq, total, state) + (self.shared_tail(state, total) is not None)

    def block_pages(self, seq: Request, total: int, num_blocks: int, num_held: int) -> int:
        """Pages of the next block: what the block-sizing policy asks, never past the request's
        largest possible length (so a request that fits alone always fits)."""
        page_size = self.page_size
        needed = -(-total // page_size) - num_held
        if needed <= 0:
            return 0
        wanted = self.block_sizing.pages_for_next_block(seq, num_blocks, needed)
        ceiling = -(-max(total, seq.total_len) // page_size) - num_held
        return max(needed, min(wanted, ceiling))

    def new_block_pages(self, seq: Request, total: int, num_hits: int) -> int:
        """Pages of a new sequence's first block, after its `num_hits` hit pages, to hold
        `total` tokens: its reserved region (contiguous), else the block-sizing policy's."""
        if self.pool.allocator.reserves_region:
            reserved = max(total, self._reserve(seq.total_len, self.max_model_len))
            return -(-reserved // self.page_size) - num_hits
        return self.block_pages(seq, total, 0, num_hits)

    def growth_pages(self, seq: Request, total: int, state: SeqState) -> int:
        """Pages of a held sequence's next block to hold `total` tokens (without the copy of
        a shared last page): the block-sizing policy's; a region grows by another elsewhere,
        of exactly the pages missing."""
        if self.pool.allocator.reserves_region:
            return max(0, -(-total // self.page_size) - len(state.pages))
        return self.block_pages(seq, total, state.num_blocks, len(state.pages))

    # ----------------------------------------------------------------------------- planning

    def plan_new(self, seq: Request, total: int, hits: list[int], *,
                 watermark: bool) -> Plan | None:
        """The plan for a new sequence of `total` tokens starting from the cached `hits`, or
        None when it does not fit (keeping the watermark free if asked)."""
        page_size, pool = self.page_size, self.pool
        alone = pool.num_used_pages == 0
        needed = self.new_block_pages(seq, total, len(hits))
        fits = pool.fits(needed, hits, self.watermark_pages if watermark and not alone else 0)
        # Alone in buddy memory, a request takes its whole length as power-of-two runs when its
        # own block would not fit (a prompt block rounded up past the memory), or when it was
        # preempted before: its own smaller blocks could fragment memory so that it could
        # never grow alone (a livelock). So whatever fits alone runs to its end.
        if alone and pool.allocates_runs and (seq.num_preemptions or not fits):
            whole = -(-max(total, seq.total_len) // page_size) - len(hits)
            return Plan(hits, whole, False, as_runs=True) if pool.fits_as_runs(
                whole, hits
            ) else None
        return Plan(hits, needed, False) if fits else None

    def plan_growth(self, seq: Request, total: int, state: SeqState) -> Plan | None:
        """The plan for a held sequence growing to `total` tokens, or None when it does not
        fit."""
        cow = self.shared_tail(state, total) is not None
        # The copy of a shared last page is the first page of the new block: one allocation.
        needed = self.growth_pages(seq, total, state) + cow
        if not self.pool.fits(needed, [], 0):
            return None
        return Plan([], needed, cow)

    # ----------------------------------------------------------------------------- taking

    def execute(self, seq: Request, total: int, state: SeqState | None, plan: Plan) -> MemOps:
        """Carry out `plan` (a new sequence when `state` is None): take its hits and pages,
        copy a shared last page, register the pages that fill; the MemOps it needs."""
        ops = NO_OPS
        if state is None:
            if plan.tier_hits:
                assert self.tiers is not None
                self.tiers.pin(seq.page_hashes(self.page_size), len(plan.hit_pages),
                               plan.tier_hits)
            state = self.take_hits(seq, plan.hit_pages)
        pool = self.pool
        if plan.as_runs:
            state.pages += pool.take_runs(plan.num_block_pages)
            state.num_blocks += 1
        elif plan.num_block_pages:
            block = pool.take_block(plan.num_block_pages) if plan.block is None else plan.block
            if plan.cow:  # copy the shared page written next into the block's first page
                index = self.shared_tail(state, total)
                assert index is not None, "a copy-on-write plan without a shared page"
                ops = self.copy_shared(state, index, block[0])
                block = block[1:]
            state.pages.extend(block)
            state.num_blocks += 1
        if plan.tier_hits or plan.num_transfer_pages:
            ops = self.received(state, plan)
        if total > state.num_tokens:
            self.num_live_slots += total - state.num_tokens
            state.num_tokens = total
        self.register(seq, state, state.num_tokens)
        state.fast_limit = self.fast_limit(state)
        return ops

    def copy_shared(self, state: SeqState, index: int, page: int) -> MemOps:
        """Copy on write: the shared page at `index` of the table is copied into `page`, which
        replaces it there."""
        old = state.pages[index]
        self.pool.drop_owner(old)
        self.num_dup_slots -= self.fill(index, state.num_tokens)
        state.pages[index] = page
        return MemOps(copies=[(old, page)])

    def shared_tail(self, state: SeqState, total: int) -> int | None:
        """The index of the shared, partly filled last page that growing to `total` tokens
        writes into (so copies first), or None."""
        index, partial = divmod(state.num_tokens, self.page_size)
        if partial and total > state.num_tokens and state.pages[index] in self.pool.owners:
            return index
        return None

    def received(self, state: SeqState, plan: Plan) -> MemOps:
        """What fills a new sequence's pages after its device hits (the plan took them): the
        loads of its hits below the device, then the pages another instance sends."""
        hits, start = plan.tier_hits or [], state.num_hit_pages
        num_hits = sum(len(slots) for _, slots in hits)
        pages = state.pages[start : start + num_hits]
        start += num_hits
        loads = self.tiers.loads(hits, pages) if self.tiers is not None and hits else []
        return MemOps(tier_loads=loads,
                      transfer_ins=state.pages[start : start + plan.num_transfer_pages])

    def take_hits(self, seq: Request, hits: list[int]) -> SeqState:
        """A new sequence's state, holding its prefix-hit pages."""
        return self.hold(seq, hits, self.pool.take_hits(hits))

    def hold(self, seq: Request, hits: list[int], num_shared: int) -> SeqState:
        """A new sequence's state holding `hits`, pages the pool counts it an owner of already
        (`PagePool.take_hits`), `num_shared` of them held by other tables too."""
        self.num_dup_slots += num_shared * self.page_size
        hashes = self.hashes_of(seq) if self.caching else []
        state = SeqState(list(hits), 0, 0, 0, len(hits), hashes, True, len(hits))
        state.hash_outputs = self.hashes_outputs(seq)
        self.seqs[seq.request_id] = state
        self.num_live_slots += len(hits) * self.page_size
        state.num_tokens = len(hits) * self.page_size
        return state

    def grow_by_one_page(self, state: SeqState, total: int) -> bool:
        """The decode step that crosses a page boundary under paged, fixed-size blocks: take the
        next free page directly (the hot path of every simulation); False defers to the planner."""
        page_size = self.page_size
        limit = state.fast_limit
        if total > limit + page_size or limit != len(state.pages) * page_size:
            return False
        # A limit at the table's end means every held page is registered (or has no hash), so
        # the new page is the next to register when it has a hash: the allocation that fills
        # it takes the planner, which registers it in the step that fills it (a chunk of one
        # whole page, a decode at page size 1), and the fast path stops short of its end.
        to_register = state.hash_outputs or state.num_hashed < len(state.hashes)
        if to_register and total == limit + page_size:
            return False
        free = self.free_list
        if free:
            page = free.popleft()
        else:
            taken = self.pool.take_one()
            if taken is None:
                return False
            page = taken
        state.pages.append(page)
        state.num_blocks += 1
        state.fast_limit = limit + page_size - to_register  # (see `fast_limit`)
        self.num_live_slots += total - state.num_tokens
        state.num_tokens = total
        return True

    def fast_limit(self, state: SeqState) -> int:
        """How far `allocate` may go on a counter update alone: the end of the table's pages,
        short of a shared partial last page (the next write copies it) and of the next page to
        register (the allocation that fills it registers it, in the step that computes its
        last token, as vLLM)."""
        page_size = self.page_size
        limit = len(state.pages) * page_size
        if state.num_tokens % page_size:
            tail = state.pages[state.num_tokens // page_size]
            if tail in self.pool.owners:
                return state.num_tokens
        if state.hash_outputs or state.num_hashed < len(state.hashes):
            limit = min(limit, (state.num_hashed + 1) * page_size - 1)
        return limit

    def fork(self, src: SeqState, child: Request) -> None:
        """Share the filled pages of `src` (a parent with all its claimed KV written) with
        `child` (copy-on-write: a write copies first)."""
        num_filled = -(-src.num_tokens // self.page_size)
        pages = src.pages[:num_filled]
        owners = self.pool.owners
        for index, page in enumerate(pages):
            if page != NULL_PAGE:  # (a windowed group's page given back)
                owners[page] = owners.get(page, 1) + 1
                self.num_dup_slots += self.fill(index, src.num_tokens)
        # Both sides must take the slow path before writing into the shared last page.
        src.fast_limit = min(src.fast_limit, src.num_tokens)
        src.regular = False  # the child may register pages the parent holds, and vice versa
        hashes = self.hashes_of(child) if self.caching else []
        self.seqs[child.request_id] = SeqState(
            list(pages), src.num_tokens, src.num_tokens, src.num_blocks,
            min(src.num_hashed, len(hashes)), hashes, False, 0, self.hashes_outputs(child),
        )
        self.num_live_slots += src.num_tokens

    # ----------------------------------------------------------------------------- registering

    def hashes_of(self, seq: Request) -> list:
        """The request's page keys in the prefix cache (its page hashes)."""
        return seq.page_hashes(self.page_size)

    def hashes_outputs(self, seq: Request) -> bool:
        """Whether the sequence's output pages get hashes as they fill."""
        return self.caching and seq.output_ids_known and seq.prompt_token_ids is not None

    def register(self, seq: Request, state: SeqState, num_tokens: int) -> None:
        """Put the pages that the first `num_tokens` tokens fill into the prefix cache (prompt
        pages, and output pages of a state hashing outputs)."""
        if state.hash_outputs:
            state.hashes = self.hashes_of(seq)  # hashes the outputs known so far
        start, hashes = state.num_hashed, state.hashes
        num_full = min(len(hashes), num_tokens // self.page_size)
        if num_full <= start:
            return
        cached = self.pool.cached
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
        if self.pool.events is not None:
            self._record_stored(seq, hashes, new)
        if self.tiers is not None and self.tiers.write_through:
            self.tiers.queue_through(state.pages, hashes, new, start, num_full, state.regular)

    def register_loaded(self, seq: Request, state: SeqState, indices: list[int]) -> None:
        """Put the pages at `indices` of a new table, just given the content a tier holds for
        them, into the prefix cache under the table's keys."""
        hashes, cached = state.hashes, self.pool.cached
        for index in indices:
            cached[hashes[index]] = state.pages[index]
        if self.pool.events is not None:
            self._record_stored(seq, hashes, indices)
        if self.tiers is not None and self.tiers.write_through:
            self.tiers.queue_through(state.pages, hashes, indices, 0, 0, False)

    def _record_stored(self, seq: Request, hashes: list, indices: range | list[int]) -> None:
        """Stored events for the pages at `indices` of `seq`'s table, just registered."""
        events = self.pool.events
        assert events is not None
        page_size, has_ids = self.page_size, seq.prompt_token_ids is not None
        for index in indices:
            ids = seq.token_slice(index * page_size, (index + 1) * page_size) if has_ids else None
            events.stored(hashes[index], seq.request_id, hashes[index - 1] if index else None,
                          None if ids is None else tuple(ids))

    def num_held(self, state: SeqState) -> int:
        """Pages the table holds (a windowed group's leave out its `NULL_PAGE`s)."""
        return len(state.pages)

    def fill(self, index: int, num_tokens: int) -> int:
        """Tokens held in page `index` of a sequence of `num_tokens` tokens."""
        return max(0, min(self.page_size, num_tokens - index * self.page_size))
