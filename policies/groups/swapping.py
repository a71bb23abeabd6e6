"""Swapping a request of a model with KV-cache groups: each group's pages that its computed
tokens still need go to host memory and come back (`NULL_PAGE` behind a window), as one block
of the pool (`groups/joint.py`). A mixin of `HybridKVCacheManager`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.policies.groups.full import FullAttentionManager
from kvlab.policies.groups.joint import JointPlan, take_shares
from kvlab.policies.groups.table import Plan
from kvlab.policies.groups.windowed import WindowedManager, keeps_every_token
from kvlab.policies.manager import KVCacheManager
from kvlab.policies.outputs import MemOps
from kvlab.policies.preemption.modes import should_swap
from kvlab.policies.request import Request
from kvlab.specs.kv_groups import NULL_PAGE

if TYPE_CHECKING:
    from kvlab.policies.groups.table import SeqState


class GroupSwapping(KVCacheManager):
    """`HybridKVCacheManager`'s swap-outs and swap-ins (the manager extends this class)."""

    __slots__ = ()
    group_managers: list[FullAttentionManager]  # (the hybrid manager's)

    if TYPE_CHECKING:
        def _take_states(self, seq: Request) -> list[tuple[FullAttentionManager, SeqState]]: ...

    def _kept_pages(self, manager: FullAttentionManager,
                    num_tokens: int) -> range:
        """The table indices of a group's pages that the KV of `num_tokens` computed tokens
        still needs: all filled pages, but those behind a window; a state group's one."""
        end = -(-num_tokens // self.page_size)
        if isinstance(manager, WindowedManager):
            if manager.group.kind == "state" and not self.caching:
                return range(1 if num_tokens else 0)
            return range(min(manager.num_skipped_pages(num_tokens), end), end)
        return range(end)

    def should_swap(self, seq: Request) -> bool:
        """Whether the preemption mode swaps this victim (else it is recomputed)."""
        num_tokens = seq.num_computed_tokens
        if seq.request_id not in self._seqs or num_tokens == 0:
            return False
        num_pages = sum(len(self._kept_pages(m, num_tokens)) for m in self.group_managers)
        return should_swap(self.policy.preemption, num_pages, 1, num_tokens, self.costs)

    def can_swap_out(self, seq: Request) -> bool:
        """Whether the host pool has room for the pages every group keeps (and the request
        was not given memory in this step)."""
        if seq.request_id not in self._seqs or seq.request_id in self._steps.new:
            return False
        num_tokens = seq.num_computed_tokens
        return self.host.can_store(sum(len(self._kept_pages(m, num_tokens))
                                       for m in self.group_managers))

    def swap_out(self, seq: Request) -> MemOps:
        """Copy every group's kept pages to host memory, group after group, and release all
        device pages."""
        assert seq.request_id not in self._steps.new, "call can_swap_out first"
        num_tokens = seq.num_computed_tokens
        held = self._take_states(seq)
        pages = [state.pages[index] for manager, state in held
                 for index in self._kept_pages(manager, num_tokens)]
        assert self.host.can_store(len(pages)), "call can_swap_out first"
        host_pages = self.host.store(seq.request_id, len(pages), num_tokens)
        ops = MemOps(swap_outs=list(zip(self._steps.sources(pages), host_pages, strict=True)))
        for manager, state in held:
            manager.release(seq, state)
        return ops

    def can_swap_in(self, seq: Request) -> bool:
        """Whether device memory has room for the request's swapped pages, keeping the
        watermark free."""
        return self._swap_in_plan(seq) is not None

    def _swap_in_plan(self, seq: Request) -> JointPlan | None:
        """The pages every group takes back (the ones `_kept_pages` saved) as one block, or,
        alone in buddy memory, as power-of-two runs with the full-attention groups' whole
        length (as `_plan_alone`: a swapped request was preempted, and whatever fits alone
        runs to its end); None when they do not fit."""
        stored = self.host.stored(seq.request_id)
        if stored is None:
            return None
        pool, num_tokens = self.pool, stored[1]
        managers = self.group_managers
        kept = [len(self._kept_pages(m, num_tokens)) for m in managers]
        if not pool.num_used_pages and pool.allocates_runs:
            whole = -(-max(seq.total_len, num_tokens) // self.page_size)
            adds = [whole if keeps_every_token(m) else num_kept
                    for m, num_kept in zip(managers, kept, strict=True)]
            return JointPlan([], adds, as_runs=True) if pool.fits_as_runs(sum(adds), []) \
                else None
        reserve = self.watermark_pages if pool.num_used_pages else 0
        return JointPlan([], kept) if pool.fits(sum(kept), [], reserve) else None

    def swap_in(self, seq: Request) -> MemOps | None:
        """Bring every group's pages back from host memory (`NULL_PAGE` behind its window);
        None when device memory is short."""
        plan = self._swap_in_plan(seq)
        if plan is None:
            return None
        stored = self.host.stored(seq.request_id)
        assert stored is not None
        host_pages, num_tokens = stored
        self.host.release(seq.request_id, hold=self._steps.active)
        managers, pages = self.group_managers, []
        kept = [self._kept_pages(manager, num_tokens) for manager in managers]
        shares = take_shares(self.pool, plan, managers.index(self._main))
        for manager, group_kept, share in zip(managers, kept, shares, strict=True):
            state = manager.take_hits(seq, [NULL_PAGE] * group_kept.start)
            manager.execute(seq, num_tokens, state, Plan([], len(share), False, block=share))
            pages += state.pages[group_kept.start : group_kept.stop]
        self._steps.given_memory(seq.request_id, loaded=True)
        return MemOps(swap_ins=list(zip(host_pages, pages, strict=True)))
