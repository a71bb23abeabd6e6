"""The KV-cache manager of a model with several KV-cache groups (vLLM's hybrid KV cache manager).

Each group keeps one block table per request, all drawing pages from the one page pool: full
attention as `FullAttentionManager`, sliding window, chunked local and state groups as
`WindowedManager`. An allocation takes what every group needs or nothing; a prefix hit is the
longest one valid in every group (`_longest_hit`). `KVCacheManager(..., groups=...)` builds
this class when the groups are anything but one full-attention group.

Every allocation and block-sizing policy runs with groups: an allocation takes one block of
the pool for every group's pages (`groups/joint.py`). Memory tiers keep each group's pages
under its keys; a hit's page a tier holds is loaded into a fresh page (`groups/hits.py`); tier
pages of several device pages are refused. Swapping saves each group's pages that the computed
tokens still need (a window's, a state's) and brings them back behind `NULL_PAGE`s; a fork
shares every group's pages, copied on write (a state group's one page too: it is updated in
place).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.errors import KvlabError
from kvlab.policies.decode_path import DecodeAhead
from kvlab.policies.groups.full import NO_OPS, FullAttentionManager
from kvlab.policies.groups.hits import BELOW, HeldKeys, longest_hit
from kvlab.policies.groups.joint import JointPlan, take_shares
from kvlab.policies.groups.swapping import GroupSwapping
from kvlab.policies.groups.table import Plan, SeqState
from kvlab.policies.groups.windowed import WindowedManager, keeps_every_token
from kvlab.policies.outputs import MemOps, MemoryUsage, TierBatch
from kvlab.policies.request import Request
from kvlab.policies.tiers import TierRuns
from kvlab.specs.kv_groups import NULL_PAGE, KVCacheGroup


class HybridKVCacheManager(GroupSwapping):
    """`KVCacheManager` over several KV-cache groups (see the module's notes)."""

    __slots__ = ("group_managers", "groups")

    def __init__(self, *args: object, groups: Sequence[KVCacheGroup],
                 retention_interval: int | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if self.precision is not None:
            raise KvlabError("precision: demotion works on models with one full-attention "
                             "KV-cache group; this model has several (a hybrid model)")
        if self._tier_link is not None and self._tier_link.unit != 1:
            raise KvlabError("kv_tier_block_size: with KV-cache groups (a hybrid model) a tier "
                             "page holds one device page; leave it unset or set it to the block "
                             f"size, {self.page_size} tokens", parameters=("kv_tier_block_size",))
        self._hybrid_init(groups, retention_interval)

    def _hybrid_init(self, groups: Sequence[KVCacheGroup],
                     retention_interval: int | None) -> None:
        policy = self.policy
        if retention_interval is not None and (
                retention_interval < 0 or retention_interval % self.page_size):
            raise KvlabError(f"prefix_cache_retention_interval is {retention_interval}: "
                             f"expected None, 0 or a multiple of the page size {self.page_size}",
                             parameters=("prefix_cache_retention_interval",))
        self.groups = tuple(groups)
        managers: list[FullAttentionManager] = []
        for index, group in enumerate(self.groups):
            if group.kind == "full" and not any(
                    type(m) is FullAttentionManager for m in managers):
                managers.append(self._main)  # the first full group: plain keys
            else:
                managers.append(WindowedManager(
                    policy, self.pool, max_model_len=self.max_model_len, group=group,
                    group_id=index, retention_interval=retention_interval))
        for manager in managers:
            manager.tiers = self._tier_link
        self.group_managers = managers
        self._main = next((m for m in managers if type(m) is FullAttentionManager), managers[0])
        self._seqs = self._main.seqs
        self._grow = None

    # ----------------------------------------------------------------------------- queries

    def block_tables(self, seq: Request) -> list[list[int]]:
        """One block table per group, in group order (`NULL_PAGE`: given back, never read)."""
        rid = seq.request_id
        return [m.seqs[rid].pages if rid in m.seqs else [] for m in self.group_managers]

    def num_pages_held(self, seq: Request) -> int:
        """Pages the request holds, all groups together."""
        rid = seq.request_id
        return sum(m.num_held(m.seqs[rid]) for m in self.group_managers if rid in m.seqs)

    def pages_held_by_group(self) -> list[int]:
        """Pages held by each group's tables, all requests together."""
        return [sum(map(m.num_held, m.seqs.values())) for m in self.group_managers]

    def pages_needed_alone(self, seq: Request) -> int:
        """Pages the request holds at its largest with memory to itself: a whole prompt chunk
        is in memory at once, so sliding and chunked groups count every page; a state group
        one (with prefix caching two: the state before an allocation and after it, vLLM's
        align mode); a full-attention group what its allocation reserves
        (`tokens_needed_alone`)."""
        whole = -(-seq.total_len // self.page_size)
        return sum(-(-m.tokens_needed_alone(seq) // self.page_size) if keeps_every_token(m)
                   else (2 if self.caching else 1) if g.kind == "state" else whole
                   for m, g in zip(self.group_managers, self.groups, strict=True))

    def usage(self) -> MemoryUsage:
        """A snapshot of device and host memory, the live slots of every group together."""
        usage = super().usage()
        live = sum(m.num_live_slots - m.num_dup_slots for m in self.group_managers)
        usage.num_live_token_slots = live
        usage.num_internal_frag_slots = usage.num_used_pages * self.page_size - live
        return usage

    def num_computed_prefix_tokens(self, seq: Request) -> int:
        """Leading tokens whose KV every group holds (a hit valid in every group), in whole
        pages, leaving the last token to compute."""
        if not self.caching:
            return 0
        return self._longest_hit(seq, self._lookup.num_lookup_pages(seq))[0] * self.page_size

    def _longest_hit(self, seq: Request, bound: int) -> tuple[int, list[list[int]]]:
        """The most pages (at most `bound`) of a hit valid in every group, and each group's
        table for it (`BELOW`: a page a tier holds)."""
        keys = [m.hashes_of(seq) for m in self.group_managers]
        link = self._tier_link
        if link is None:
            return longest_hit(self.group_managers, keys, bound, self.pool.cached)
        link.flush_write_backs()  # (content evicted this step is found below)
        held = HeldKeys(self.pool.cached, [tier.store for tier in link.tiers])
        return longest_hit(self.group_managers, keys, bound, held)

    # ----------------------------------------------------------------------------- allocation

    def can_allocate(self, seq: Request, num_new_tokens: int) -> bool:
        """Whether `allocate(seq, num_new_tokens)` would succeed now."""
        return self._plan_groups(seq, num_new_tokens) is not None

    def allocate(self, seq: Request, num_new_tokens: int) -> MemOps | None:
        """Room for `num_new_tokens` more tokens in every group, or None (nothing changed)."""
        rid, total = seq.request_id, seq.num_computed_tokens + num_new_tokens
        managers = self.group_managers
        held = self._held(rid)
        if held is not None and all(total <= state.fast_limit for state in held):
            self._claim(held, total)
            return NO_OPS
        plan = self._plan_groups(seq, num_new_tokens)
        if plan is None:
            return None
        new = held is None
        if held is None:  # every group's hits first: no block may evict another's hit
            held = self._take_hits(seq, plan.hits)
        else:  # pages skipped go before any are taken (vLLM's order)
            for manager, state in zip(managers, held, strict=True):
                if isinstance(manager, WindowedManager):
                    manager.remove_skipped(state, seq.num_computed_tokens)
        shares = take_shares(self.pool, plan, managers.index(self._main))
        loads = self._load_below(seq, held, shares) if new and self._tier_link else []
        copies = []
        for manager, state, share in zip(managers, held, shares, strict=True):
            cow = bool(share) and manager.shared_tail(state, total) is not None
            step = Plan([], len(share), cow, block=share)
            copies += manager.execute(seq, total, state, step).copies
        result = MemOps(copies=copies, tier_loads=loads) if copies or loads else NO_OPS
        if self._steps.active:
            self._steps.allocated(rid, new, result, NO_OPS)
        return result

    def _take_hits(self, seq: Request, hits: list[list[int]]) -> list[SeqState]:
        """A new request's state in every group, holding its hit's device pages (`BELOW`
        where only a tier holds the page: `_load_below` fills it)."""
        pool, managers = self.pool, self.group_managers
        lookup, main = self._lookup, managers.index(self._main)  # (hits counted in its table)
        lookup.num_queries += lookup.num_lookup_pages(seq)
        lookup.num_hits += len(hits[main]) - hits[main].count(BELOW)
        shared = [pool.take_hits([page for page in table if page >= 0]) for table in hits]
        return [m.hold(seq, table, num_shared)
                for m, table, num_shared in zip(managers, hits, shared, strict=True)]

    def _load_below(self, seq: Request, states: list[SeqState],
                    shares: list[list[int]]) -> list[TierBatch]:
        """Give each group's `BELOW` entries the first pages of its share (cut from it), their
        content loaded from the tiers and registered; count the hit's pages per level."""
        link, managers = self._tier_link, self.group_managers
        assert link is not None
        main = managers.index(self._main)
        levels = [states[main].num_hit_pages] + [0] * len(link.tiers)
        runs: TierRuns = []
        fresh: list[int] = []
        hit_keys = []
        for group, (manager, state) in enumerate(zip(managers, states, strict=True)):
            hit_keys += [state.hashes[index] for index in range(state.num_hit_pages)
                         if state.pages[index] != NULL_PAGE]
            below = [index for index in range(state.num_hit_pages)
                     if state.pages[index] == BELOW]
            if not below:
                continue
            pages, shares[group] = shares[group][: len(below)], shares[group][len(below) :]
            for index, page in zip(below, pages, strict=True):
                level, slot = link.locate(state.hashes[index])
                link.pin([state.hashes[index]], 0, [(level, [slot])])
                runs.append((level, [slot]))
                state.pages[index] = page
                levels[0] -= group == main
                levels[level] += group == main
            fresh += pages
            manager.register_loaded(seq, state, below)
        link.count_group_hits(hit_keys, levels)
        return link.loads(runs, fresh)

    def _held(self, request_id: int) -> list[SeqState] | None:
        """The request's state in every group (it holds one in each or in none)."""
        if request_id not in self.group_managers[0].seqs:
            return None
        return [m.seqs[request_id] for m in self.group_managers]

    def _claim(self, states: list[SeqState], total: int) -> None:
        for manager, state in zip(self.group_managers, states, strict=True):
            if total > state.num_tokens:
                manager.num_live_slots += total - state.num_tokens
                state.num_tokens = total

    def _plan_groups(self, seq: Request, num_new_tokens: int) -> JointPlan | None:
        """The pages every group takes for `num_new_tokens` more tokens (`groups/joint.py`),
        or None when they do not fit together."""
        total, computed = seq.num_computed_tokens + num_new_tokens, seq.num_computed_tokens
        held, pool = self._held(seq.request_id), self.pool
        managers = self.group_managers
        if held is not None:
            adds = [m.pages_to_grow(seq, total, state)
                    for m, state in zip(managers, held, strict=True)]
            freed = [page for m, state in zip(managers, held, strict=True)
                     if isinstance(m, WindowedManager) for page in m.freed_by_skip(state, computed)]
            if pool.fits(sum(adds), [], 0, freed):
                return JointPlan([], adds)
            # Alone in buddy memory, a window's next pages may find no free block of their
            # size for fragments nobody else will free: any free pages will do (runs).
            alone = pool.num_used_pages == self.num_pages_held(seq)
            if alone and pool.allocates_runs and sum(adds) <= (
                    pool.num_free_pages + pool.num_cached_free_pages + len(freed)):
                return JointPlan([], adds, as_runs=True)
            return None
        hits = self._new_hits(seq)
        real_hits = [page for table in hits for page in table if page >= 0]
        reserve = self.watermark_pages if pool.num_used_pages else 0
        adds = [m.pages_to_start(seq, total, len(table)) + table.count(BELOW)  # (a page each
                for m, table in zip(managers, hits, strict=True)]  # to load a tier's into)
        fits = pool.fits(sum(adds), real_hits, reserve)
        if not pool.num_used_pages and pool.allocates_runs and (
                seq.num_preemptions or not fits):
            return self._plan_alone(seq, total, hits, real_hits)
        return JointPlan(hits, adds) if fits else None

    def _plan_alone(self, seq: Request, total: int, hits: list[list[int]],
                    real_hits: list[int]) -> JointPlan | None:
        """A new request alone in buddy memory: its full-attention groups take its whole
        length at once, every group's pages as power-of-two runs (a request that fits alone
        always runs to its end)."""
        whole = max(seq.total_len, total)
        adds = [(m.pages_to_add(len(table), whole) if keeps_every_token(m)
                 else m.pages_to_start(seq, total, len(table))) + table.count(BELOW)
                for m, table in zip(self.group_managers, hits, strict=True)]
        if not self.pool.fits_as_runs(sum(adds), real_hits):
            return None
        return JointPlan(hits, adds, as_runs=True)

    def _new_hits(self, seq: Request) -> list[list[int]]:
        """Each group's table of a new request's prefix hit: its `num_computed_tokens`."""
        num_computed = seq.num_computed_tokens
        num_pages, partial = divmod(num_computed, self.page_size)
        if not num_computed:
            return [[] for _ in self.groups]
        found, tables = self._longest_hit(seq, num_pages) if self.caching else (0, [])
        if partial or found != num_pages:
            raise ValueError(
                f"request {seq.request_id}: num_computed_tokens is {num_computed}, but a "
                f"prefix hit valid in every KV-cache group holds {found * self.page_size} of "
                "its first tokens now; set it from num_computed_prefix_tokens() (or to 0) "
                "just before allocate")
        return tables

    def allocate_decodes(self, requests: list[Request], start: int, budget: int) -> int:
        """Claim one token for each decode in `requests[start:]` whose every group has room
        without the planner; stops at the first that is not such a decode."""
        tables = [m.seqs for m in self.group_managers]
        first = tables[0]
        gained = [0] * len(tables)  # live slots each group gains
        num_claimed = 0
        for request in requests[start : start + budget]:
            done = request.num_computed_tokens
            if request.prompt_len + request.num_output_tokens - done != 1 or not done:
                break
            rid = request.request_id
            if rid not in first:
                break
            held = [seqs[rid] for seqs in tables]
            total = done + 1
            if any(total > state.fast_limit for state in held):
                break
            for index, state in enumerate(held):  # (as `_claim`, the counters summed once)
                if total > state.num_tokens:
                    gained[index] += total - state.num_tokens
                    state.num_tokens = total
            num_claimed += 1
        for manager, num_slots in zip(self.group_managers, gained, strict=True):
            manager.num_live_slots += num_slots
        return num_claimed

    def decode_run_ahead(self, requests: list[Request], max_steps: int) -> DecodeAhead | None:
        """None: groups take their decode steps one by one."""
        return None

    def free(self, seq: Request) -> None:
        """Release everything the request holds, in every group (pages a swap-in of this
        step writes: at the step's end)."""
        rid = seq.request_id
        deferred = rid in self._steps.loaded
        for manager, state in self._take_states(seq):
            if deferred:
                self._steps.defer_release(manager, seq, state)
            else:
                manager.release(seq, state)
        self.host.release(rid)

    def _take_states(self, seq: Request) -> list[tuple[FullAttentionManager, SeqState]]:
        """Remove the request's state from every group (once none refuses: StepOrderError)."""
        rid = seq.request_id
        held = [(m, m.seqs[rid]) for m in self.group_managers if rid in m.seqs]
        for manager, state in held:
            manager.check_release(seq, state)
        for manager, _ in held:
            del manager.seqs[rid]
        return held

    def fork(self, parent: Request, child: Request) -> None:
        """Share the parent's pages in every group with `child` (copy-on-write)."""
        self._check_fork(parent, child)
        for manager in self.group_managers:
            manager.fork(manager.seqs[parent.request_id], child)
        self._steps.given_memory(child.request_id)
