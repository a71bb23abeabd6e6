"""A shadow executor for the KV-cache manager: it carries out MemOps on fake memory and checks
every invariant the manager promises, after every operation."""

from __future__ import annotations

from kvlab.policies import KVCacheManager, MemOps, Request


class ShadowCost:
    """A cost model for preemption=auto: swapping is cheap for short sequences only."""

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        return 0.001 * num_transfers + 0.002 * num_pages

    def recompute_time_s(self, num_tokens: int) -> float:
        return 0.0005 * num_tokens


class Harness:
    """Drives a manager like an engine: allocate, write the new tokens, commit; checks memory."""

    def __init__(self, spec: str, num_pages: int, max_model_len: int = 256, host_pages=None):
        self.manager = KVCacheManager(
            spec,
            num_pages,
            max_model_len=max_model_len,
            num_host_pages=host_pages,
            costs=ShadowCost(),
        )
        self.page_size = self.manager.page_size
        self.device: dict[int, object] = {}  # slot -> token content
        self.host: dict[int, object] = {}
        self.live: dict[int, Request] = {}  # sequences holding device memory
        self.swapped: dict[int, Request] = {}
        self.log: list = []  # every decision, for determinism checks

    # ------------------------------------------------------------------ operations
    def content(self, seq: Request, index: int) -> object:
        if seq.prompt_token_ids is not None and index < seq.prompt_len:
            return seq.prompt_token_ids[index]
        if seq.hash_ids is not None and index < seq.prompt_len:
            block = index // seq.hash_block_size
            if block < len(seq.hash_ids):  # a trace block id names its tokens at their places
                return ("block", seq.hash_ids[block], index)
        return (seq.request_id, index)

    def add(self, seq: Request) -> bool:
        """Admit a new sequence with its prefix-cache hit and its whole prompt."""
        hit = self.manager.num_computed_prefix_tokens(seq)
        assert hit % self.page_size == 0 and hit <= seq.num_tokens - 1
        seq.num_computed_tokens = hit
        can = self.manager.can_allocate(seq, seq.num_tokens - hit)
        ops = self.manager.allocate(seq, seq.num_tokens - hit)
        assert can == (ops is not None)
        self.log.append(("add", seq.request_id, hit, ops is not None))
        if ops is None:
            seq.num_computed_tokens = 0
            return False
        self._execute(ops)
        self._write(seq, hit, seq.num_tokens)
        self.live[seq.request_id] = seq
        return True

    def grow(self, seq: Request, num_new: int) -> bool:
        """Decode (num_new=1) or extend a sequence by new tokens."""
        can = self.manager.can_allocate(seq, num_new)
        ops = self.manager.allocate(seq, num_new)
        assert can == (ops is not None)
        self.log.append(("grow", seq.request_id, num_new, ops is not None))
        if ops is None:
            return False
        self._execute(ops)
        start = seq.num_computed_tokens
        seq.num_output_tokens += num_new
        self._write(seq, start, start + num_new)
        return True

    def free(self, seq: Request) -> None:
        self.manager.free(seq)
        self.log.append(("free", seq.request_id))
        self.live.pop(seq.request_id, None)
        self.swapped.pop(seq.request_id, None)

    def fork(self, parent: Request, child: Request) -> None:
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_output_tokens = parent.num_output_tokens
        self.manager.fork(parent, child)
        self.log.append(("fork", parent.request_id, child.request_id))
        self.live[child.request_id] = child

    def swap_out(self, seq: Request) -> bool:
        if not self.manager.can_swap_out(seq):
            return False
        ops = self.manager.swap_out(seq)
        self.log.append(("swap_out", seq.request_id, ops.swap_outs))
        self._execute(ops)
        del self.live[seq.request_id]
        self.swapped[seq.request_id] = seq
        return True

    def swap_in(self, seq: Request) -> bool:
        can = self.manager.can_swap_in(seq)
        ops = self.manager.swap_in(seq)
        assert can == (ops is not None)
        self.log.append(("swap_in", seq.request_id, ops.swap_ins if ops else None))
        if ops is None:
            return False
        self._execute(ops)
        del self.swapped[seq.request_id]
        self.live[seq.request_id] = seq
        return True

    # ------------------------------------------------------------------ execution
    def _execute(self, ops: MemOps) -> None:
        ps = self.page_size
        for src, dst in ops.swap_outs:
            for off in range(ps):
                self._move(self.device, src * ps + off, self.host, dst * ps + off)
        for src, dst in ops.copies:
            for off in range(ps):
                self._move(self.device, src * ps + off, self.device, dst * ps + off)
        for src, dst in ops.swap_ins:
            for off in range(ps):
                self._move(self.host, src * ps + off, self.device, dst * ps + off)

    @staticmethod
    def _move(src: dict, src_slot: int, dst: dict, dst_slot: int) -> None:
        if src_slot in src:
            dst[dst_slot] = src[src_slot]
        else:
            dst.pop(dst_slot, None)

    def _write(self, seq: Request, start: int, end: int) -> None:
        table = self.manager.block_table(seq)
        ps = self.page_size
        for index in range(start, end):
            self.device[table[index // ps] * ps + index % ps] = self.content(seq, index)
        seq.num_computed_tokens = end

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        m, ps = self.manager, self.page_size
        usage = m.usage()
        assert usage.num_used_pages + usage.num_cached_free_pages + usage.num_free_pages == (
            usage.num_total_pages
        )
        owners: dict[int, int] = {}
        live_slots: dict[int, int] = {}
        for seq in self.live.values():
            table = m.block_table(seq)
            assert table, f"live sequence {seq.request_id} holds no pages"
            assert len(set(table)) == len(table), "a page appears twice in one table"
            for index, page in enumerate(table):
                owners[page] = owners.get(page, 0) + 1
                fill = max(0, min(ps, seq.num_computed_tokens - index * ps))
                live_slots[page] = max(live_slots.get(page, 0), fill)
            # the logical content of every computed token is where the table says
            for index in range(seq.num_computed_tokens):
                slot = table[index // ps] * ps + index % ps
                assert self.device.get(slot) == self.content(seq, index), (
                    f"seq {seq.request_id} token {index} lost"
                )
        for seq in self.swapped.values():
            assert m.block_table(seq) == []
            assert m.is_swapped(seq)
        # no page is owned without a reference, and refs count exactly the owners
        # (the manager counts owners only of pages held by two or more)
        assert m._owners == {page: n for page, n in owners.items() if n > 1}
        for page in owners:
            assert m.num_owners(page) == owners[page], f"page {page}"
        assert not set(m.evictor.pages()) & owners.keys(), "an owned page is cached-free"
        assert usage.num_used_pages == len(owners)
        assert usage.num_live_token_slots == sum(live_slots.values())
        assert usage.num_internal_frag_slots == len(owners) * ps - sum(live_slots.values())
        # the prefix cache: one page per key; its pages are owned or cached-free, and the
        # cached-free ones are exactly the eviction policy's
        cached_pages = set(m._cached.values())
        assert len(cached_pages) == len(m._cached), "two keys point at one page"
        cached_free = sorted(cached_pages - owners.keys())
        assert usage.num_cached_free_pages == len(cached_free)
        assert sorted(m.evictor.pages()) == cached_free
        assert all(page in m.evictor for page in cached_free)
        # a registered page holds exactly its key's content: it sits at that key's index in
        # the table of every live sequence holding it
        key_of = {page: key for key, page in m._cached.items()}
        for seq in self.live.values():
            hashes = seq.page_hashes(ps) if m.caching else []
            for index, page in enumerate(m.block_table(seq)):
                if page in key_of:
                    assert index < len(hashes) and hashes[index] == key_of[page], (
                        f"seq {seq.request_id} page {page} at {index} holds another prefix"
                    )
        host_used = sum(-(-s.num_computed_tokens // ps) for s in self.swapped.values())
        assert usage.num_host_used_pages == host_used
