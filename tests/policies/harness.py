"""Drives a KV-cache manager like an engine (allocate, write the new tokens, commit) and checks
it after every operation twice: against the independent `ShadowMemory` (public interface only)
and against the manager's own bookkeeping (owner counts, the prefix cache, the counters)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvlab.policies import ArrivalQueue, KVCacheManager, MemOps, Request, Scheduler
from tests.policies.shadow import PrefixContent, ShadowMemory


def compute(manager: KVCacheManager, seq: Request, num_new: int) -> MemOps:
    """Allocate `num_new` tokens (a new sequence first takes its prefix hit) and count them
    computed; the allocation's MemOps."""
    if manager.num_pages_held(seq) == 0:
        seq.num_computed_tokens = manager.num_computed_prefix_tokens(seq)
    ops = manager.allocate(seq, num_new)
    assert ops is not None
    seq.num_computed_tokens += num_new
    return ops


def computed(seq: Request, start: int, num_new: int) -> None:
    """Tokens [start, start + num_new) were computed: count them, and the outputs among them
    (with a few distinct sampled ids where output ids are known, so output pages can be
    shared)."""
    num_outputs = start + num_new - seq.prompt_len
    if num_outputs > seq.num_output_tokens:
        if seq.output_ids_known:
            seq.output_token_ids += [index % 3 for index in range(seq.num_output_tokens,
                                                                  num_outputs)]
        seq.num_output_tokens = num_outputs
    seq.num_computed_tokens = start + num_new


def serve_steps(scheduler: Scheduler, requests: Sequence[Request],
                on_step: Callable[[Any], list[int | None] | None],
                max_steps: int = 20_000) -> int:
    """Admit `requests` at their arrivals and step `scheduler` until every one has finished,
    10 ms a step: `on_step(output)` checks each step's output and returns the samples the
    step's update takes (None: no tokens). Returns the steps run; a livelock fails."""
    arrivals = ArrivalQueue(requests)
    now, steps = 0.0, 0
    while len(arrivals) or scheduler.has_unfinished():
        arrivals.admit_until(now, scheduler)
        if not scheduler.has_unfinished():
            now = arrivals.next_arrival_s()
            continue
        output = scheduler.schedule(now)
        samples = on_step(output)
        now += 0.01
        scheduler.update(output, samples, now)
        steps += 1
        assert steps < max_steps, (
            f"livelock: {len(scheduler.waiting)} waiting, "
            f"{len(scheduler.running)} running, {len(scheduler.swapped)} swapped"
        )
    return steps


class ShadowCost:
    """A cost model for preemption=auto: swapping is cheap for short sequences only."""

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        return 0.001 * num_transfers + 0.002 * num_pages

    def recompute_time_s(self, num_tokens: int) -> float:
        return 0.0005 * num_tokens


class Harness:
    """One manager, its shadow, and the sequences the driver made (live or swapped out)."""

    def __init__(self, spec: str, num_pages: int, max_model_len: int = 256, host_pages=None,
                 tiers=None, tier_config=None):
        self.manager = KVCacheManager(
            spec,
            num_pages,
            max_model_len=max_model_len,
            num_host_pages=host_pages,
            costs=ShadowCost(),
            tiers=tiers,
            tier_config=tier_config,
        )
        self.page_size = self.manager.page_size
        self.copied: dict[int, dict[int, object]] = {}  # a fork's tokens, copied from its parent
        self._prefix_content = PrefixContent()
        self.shadow = ShadowMemory(self.manager, self.content)
        self.live: dict[int, Request] = {}  # sequences holding device memory
        self.swapped: dict[int, Request] = {}
        self.log: list = []  # every decision, for determinism checks

    # ------------------------------------------------------------------ operations
    def content(self, seq: Request, index: int) -> object:
        copied = self.copied.get(seq.request_id)
        if copied is not None and index in copied:
            return copied[index]
        return self._prefix_content(seq, index)

    def lookup(self, seq: Request) -> int:
        """The prefix-cache hit of a new sequence (whole pages, leaving its last token)."""
        hit = self.manager.num_computed_prefix_tokens(seq)
        assert hit % self.page_size == 0 and hit <= seq.num_tokens - 1
        return hit

    def add(self, seq: Request, num_new: int | None = None, hit: int | None = None) -> bool:
        """Admit a new sequence with a prefix hit (looked up now unless given) and `num_new`
        tokens after it (default: all of them)."""
        if hit is None:
            hit = self.lookup(seq)
        num_new = seq.num_tokens - hit if num_new is None else num_new
        seq.num_computed_tokens = hit
        can = self.manager.can_allocate(seq, num_new)
        ops = self.manager.allocate(seq, num_new)
        assert can == (ops is not None)
        self.log.append(("add", seq.request_id, hit, ops is not None))
        if ops is None:
            seq.num_computed_tokens = 0
            return False
        self.shadow.execute(ops)
        self.shadow.admitted(seq, hit)
        self.shadow.wrote(seq, hit, hit + num_new)
        seq.num_computed_tokens = hit + num_new
        self.live[seq.request_id] = seq
        return True

    def grow(self, seq: Request, num_new: int) -> bool:
        """Compute `num_new` more tokens: the rest of the prompt first, then new outputs."""
        can = self.manager.can_allocate(seq, num_new)
        ops = self.manager.allocate(seq, num_new)
        assert can == (ops is not None)
        self.log.append(("grow", seq.request_id, num_new, ops is not None))
        if ops is None:
            return False
        self.shadow.execute(ops)
        self.shadow.grew(seq, ops.copies)
        start = seq.num_computed_tokens
        computed(seq, start, num_new)
        self.shadow.wrote(seq, start, start + num_new)
        return True

    def free(self, seq: Request) -> None:
        self.manager.free(seq)
        self.log.append(("free", seq.request_id))
        self.shadow.freed(seq)
        self.live.pop(seq.request_id, None)
        self.swapped.pop(seq.request_id, None)

    def fork(self, parent: Request, child: Request) -> None:
        """`child` (a new request with the parent's prompt) continues from the parent's tokens."""
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_output_tokens = parent.num_output_tokens
        child.output_token_ids = list(parent.output_token_ids)
        self.copied[child.request_id] = {
            index: self.content(parent, index) for index in range(parent.num_computed_tokens)
        }
        self.manager.fork(parent, child)
        self.log.append(("fork", parent.request_id, child.request_id))
        self.shadow.forked(parent, child)
        self.live[child.request_id] = child

    def swap_out(self, seq: Request) -> bool:
        if not self.manager.can_swap_out(seq):
            return False
        ops = self.manager.swap_out(seq)
        self.log.append(("swap_out", seq.request_id, ops.swap_outs))
        self.shadow.swapped_out(seq, ops.swap_outs)
        self.shadow.execute(ops)
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
        self.shadow.swapped_in(seq, ops.swap_ins)
        self.shadow.execute(ops)
        del self.swapped[seq.request_id]
        self.live[seq.request_id] = seq
        return True

    # ------------------------------------------------------------------ invariants
    def check(self) -> None:
        """The shadow's checks, then the manager's own bookkeeping against the tables."""
        self.shadow.check()
        m, ps = self.manager, self.page_size
        usage = m.usage()
        owners: dict[int, int] = {}
        live_slots: dict[int, int] = {}
        for seq in self.live.values():
            for index, page in enumerate(m.block_table(seq)):
                owners[page] = owners.get(page, 0) + 1
                fill = max(0, min(ps, seq.num_computed_tokens - index * ps))
                live_slots[page] = max(live_slots.get(page, 0), fill)
        # the manager counts owners only of pages held by two or more
        assert m.pool.owners == {page: n for page, n in owners.items() if n > 1}
        for page in owners:
            assert m.num_owners(page) == owners[page], f"page {page}"
        assert not set(m.evictor.pages()) & owners.keys(), "an owned page is cached-free"
        assert usage.num_live_token_slots == sum(live_slots.values())
        assert usage.num_internal_frag_slots == len(owners) * ps - sum(live_slots.values())
        # the prefix cache: one page per key; its pages are owned or cached-free, and the
        # cached-free ones are exactly the eviction policy's
        cached_pages = set(m.pool.cached.values())
        assert len(cached_pages) == len(m.pool.cached), "two keys point at one page"
        cached_free = sorted(cached_pages - owners.keys())
        assert usage.num_cached_free_pages == len(cached_free)
        assert sorted(m.evictor.pages()) == cached_free
        assert all(page in m.evictor for page in cached_free)
        # a registered page holds exactly its key's content: it sits at that key's index in
        # the table of every live sequence holding it
        key_of = {page: key for key, page in m.pool.cached.items()}
        for seq in self.live.values():
            hashes = seq.page_hashes(ps) if m.caching else []
            for index, page in enumerate(m.block_table(seq)):
                if page in key_of:
                    assert index < len(hashes) and hashes[index] == key_of[page], (
                        f"seq {seq.request_id} page {page} at {index} holds another prefix"
                    )
