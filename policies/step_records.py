"""What the later calls of a step must know of its earlier ones (`KVCacheManager`'s step rules).

Between `begin_step` and `end_step` the MemOps of every call run together, in MemOps order,
before the step computes: a page copied on write is still its source's when swap-outs run, a
sequence given memory may receive its KV later in the step, and pages that loads write must not
be handed to anyone before those loads run.
"""

from __future__ import annotations

from kvlab.policies.groups.full import FullAttentionManager
from kvlab.policies.groups.table import SeqState
from kvlab.policies.outputs import MemOps
from kvlab.policies.request import Request


class StepRecords:
    """The step's records: `active` between begin and end; `copies` (copy-on-write this step:
    destination -> source); `new` (requests given memory this step: admitted, swapped in,
    forked); `loaded` (of those, the ones whose pages receive swap-ins, tier loads or
    transfers); `freed` (of those, the ones freed since, released at the step's end)."""

    __slots__ = ("active", "copies", "freed", "loaded", "new")

    def __init__(self) -> None:
        self.active = False
        self.copies: dict[int, int] = {}
        self.new: set[int] = set()
        self.loaded: set[int] = set()
        # (the group's manager, the request, its state there, the tokens it wrote)
        self.freed: list[tuple[FullAttentionManager, Request, SeqState, int]] = []

    def allocated(self, request_id: int, new: bool, ops: MemOps, no_ops: MemOps) -> None:
        """An allocation in the step (`new`: the request's first) gave `ops`."""
        if new:
            self.new.add(request_id)
        if ops is no_ops:
            return
        copies = self.copies
        for source, destination in ops.copies:  # a copy of a copy reads the first source
            copies[destination] = copies.get(source, source)
        if ops.tier_loads or ops.transfer_ins:
            self.loaded.add(request_id)

    def given_memory(self, request_id: int, *, loaded: bool = False) -> None:
        """A request got pages in the step (forked; swapped in: `loaded`)."""
        if self.active:
            self.new.add(request_id)
            if loaded:
                self.loaded.add(request_id)

    def defer_release(self, manager: FullAttentionManager, request: Request,
                      state: SeqState) -> None:
        """`request`, freed in the step, is released at the step's end (the step's loads still
        write its pages); the pages registered past its computed tokens leave the prefix cache
        now, so that no later lookup of the step takes them as hits."""
        num_written = request.num_computed_tokens
        manager.unregister_unwritten(state, num_written)
        self.freed.append((manager, request, state, num_written))

    def sources(self, pages: list[int]) -> list[int]:
        """`pages` as swap-outs read them: a page copied this step from its source."""
        copies = self.copies
        return [copies.get(page, page) for page in pages] if copies else pages

    def end(self) -> list[tuple[FullAttentionManager, Request, SeqState, int]]:
        """Forget the step; the frees it deferred, to release now."""
        self.active = False
        if self.copies:
            self.copies.clear()
        if not self.new:
            return []
        self.new.clear()
        self.loaded.clear()
        freed, self.freed = self.freed, []
        return freed
