"""A random walk through a KV-cache manager in steps, as an engine drives it: each step is a
random order of calls between `begin_step` and `end_step`, then the step's MemOps carried out
together in their documented order on the shadow, then the tokens allocated computed. Checked
after every step against the shadow (content of every level), the manager's own bookkeeping
(`Harness.check`), its KV events (a page is stored in the step that fills it), its tiers
(conservation; no store is handed a key it holds, or one key twice) and the step-order rules
(an order the manager refuses changes nothing)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvlab.policies import MemOps, Request, StepOrderError
from kvlab.policies.tiers import PrefixTier, TierStore
from tests.policies.harness import Harness, computed
from tests.policies.shadow import CachedKeys, ShadowError, check_whole_tier_pages


class CheckedStore:
    """A tier store that fails when handed a key it holds (`put_many`) or one key twice."""

    def __init__(self, store: TierStore) -> None:
        self._store = store

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def __contains__(self, key: object) -> bool:
        return key in self._store

    def put_many(self, keys: list):
        _require_distinct(keys, "put_many")
        held = [key for key in keys if key in self._store]
        if held:
            raise ShadowError(f"put_many was handed keys its tier holds: {held}")
        return self._store.put_many(keys)

    def put_into_free(self, keys: list):
        _require_distinct(keys, "put_into_free")
        return self._store.put_into_free(keys)


def _require_distinct(keys: list, call: str) -> None:
    if len(set(keys)) != len(keys):
        raise ShadowError(f"{call} was handed one key twice: {keys}")


def check_stores(tiers: list[PrefixTier] | None) -> None:
    """Wrap every tier's store in a `CheckedStore`."""
    for tier in tiers or ():
        tier.store = CheckedStore(tier.store)


@dataclass
class _Step:
    """What the calls of one step decided, for the shadow, in decision order: ("fork", parent,
    child, the child's table), ("release", sequence, None when freed, else its swap-outs and
    the step's copies decided before), ("swap_in", sequence, its swap-ins, its table then),
    ("allocate", sequence, its computed tokens before, tokens allocated, the prefix keys of its
    pages whose
    tokens were known at the allocation, its copies-on-write, None where it is computed, else
    the table it held when it was released)."""

    ops: MemOps = field(default_factory=MemOps)
    calls: list[tuple] = field(default_factory=list)
    touched: set[int] = field(default_factory=set)  # ids allocated (at most once a step)

    def released(self, seq: Request, swap: tuple[list, list] | None, table: list[int]) -> None:
        """The sequence was freed or swapped out, holding `table`: its allocation of the step
        is never computed (but a copy-on-write it made replaced a page of its table)."""
        self.calls = [(*call[:6], table)
                      if call[0] == "allocate" and call[1] is seq and call[6] is None else call
                      for call in self.calls]
        self.calls.append(("release", seq, swap))


class StepWalk:
    """One manager in a `Harness`, driven step by step from a seeded random generator."""

    def __init__(self, harness: Harness, rng: random.Random, new_request) -> None:
        self.h = harness
        self.manager = harness.manager
        self.rng = rng
        self.new_request = new_request  # (rng, request id) -> Request
        self.next_id = 0
        self.cached = CachedKeys(self.manager)
        check_stores(self.manager.tiers)
        self.num_refused = 0  # calls refused with StepOrderError (each checked to change nothing)

    # ------------------------------------------------------------------ one step
    def step(self, max_calls: int = 6) -> None:
        """A step of 1 to `max_calls` random calls, executed on the shadow and checked."""
        step, manager = _Step(), self.manager
        manager.begin_step()
        for _ in range(self.rng.randint(1, max_calls)):
            self._call(step)
        manager.end_step(step.ops)
        self._execute(step)

    def _call(self, step: _Step) -> None:
        rng, h = self.rng, self.h
        live = [seq for seq in h.live.values() if seq.request_id not in step.touched]
        op = rng.choice(["admit", "admit", "grow", "grow", "grow", "free", "fork", "swap_out",
                         "swap_in"])
        if op == "admit":
            self._admit(step)
        elif op == "grow" and live:
            self._grow(step, rng.choice(live))
        elif op == "free" and (h.live or h.swapped):
            self._guarded(step, lambda seq: self._free(step, seq),
                          rng.choice(list(h.live.values()) + list(h.swapped.values())))
        elif op == "fork" and h.live:
            self._guarded(step, lambda parent: self._fork(step, parent),
                          rng.choice(list(h.live.values())))
        elif op == "swap_out" and h.live:
            self._guarded(step, lambda seq: self._swap_out(step, seq),
                          rng.choice(list(h.live.values())))
        elif op == "swap_in" and h.swapped:
            self._swap_in(step, rng.choice(list(h.swapped.values())))

    def _guarded(self, step: _Step, call, seq: Request) -> None:
        """Make a call the step-order rules may refuse: refused, it must change nothing."""
        before = self.manager.usage(), list(self.manager.block_table(seq))
        try:
            call(seq)
        except StepOrderError:
            self.num_refused += 1
            after = self.manager.usage(), list(self.manager.block_table(seq))
            assert after == before, "a refused call changed memory"

    def _admit(self, step: _Step) -> None:
        seq = self.new_request(self.rng, self.next_id)
        self.next_id += 1
        hit = self.manager.num_computed_prefix_tokens(seq)
        rest = seq.num_tokens - hit
        num_new = self.rng.randint(1, min(rest, self.rng.choice([1, 2, 4, rest])))
        self._allocate(step, seq, num_new, hit)

    def _grow(self, step: _Step, seq: Request) -> None:
        room = seq.total_len - seq.num_tokens
        if room > 0:
            self._allocate(step, seq, self.rng.randint(1, min(room, self.rng.choice([1, 3, 20]))),
                           None)

    def _allocate(self, step: _Step, seq: Request, num_new: int, hit: int | None) -> None:
        manager, page_size = self.manager, self.manager.page_size
        if hit is not None:
            seq.num_computed_tokens = hit
        start = seq.num_computed_tokens
        known = list(seq.page_hashes(page_size)) if manager.caching else []
        can = manager.can_allocate(seq, num_new)
        ops = manager.allocate(seq, num_new)
        assert can == (ops is not None)
        if ops is None:
            if hit is not None:
                seq.num_computed_tokens = 0
            return
        step.ops.extend(ops)
        if ops.tier_loads and hit is not None:
            loaded = {page for batch in ops.tier_loads for page in batch.dst_pages}
            check_whole_tier_pages(seq, manager.block_table(seq), loaded, manager)
        step.touched.add(seq.request_id)
        step.calls.append(("allocate", seq, start, num_new, known, list(ops.copies), None))
        self.h.live[seq.request_id] = seq

    def _free(self, step: _Step, seq: Request) -> None:
        table = list(self.manager.block_table(seq))
        self.manager.free(seq)
        step.released(seq, None, table)
        self.h.live.pop(seq.request_id, None)
        self.h.swapped.pop(seq.request_id, None)

    def _fork(self, step: _Step, parent: Request) -> None:
        child = Request(self.next_id, parent.prompt_len, parent.max_output_tokens,
                        arrival_s=self.next_id, prompt_token_ids=parent.prompt_token_ids,
                        hash_ids=parent.hash_ids, hash_block_size=parent.hash_block_size,
                        output_ids_known=parent.output_ids_known)
        self.next_id += 1
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_output_tokens = parent.num_output_tokens
        child.output_token_ids = list(parent.output_token_ids)
        self.manager.fork(parent, child)
        self.h.copied[child.request_id] = {
            index: self.h.content(parent, index) for index in range(parent.num_computed_tokens)
        }
        step.calls.append(("fork", parent, child, list(self.manager.block_table(child))))
        self.h.live[child.request_id] = child

    def _swap_out(self, step: _Step, seq: Request) -> None:
        if not self.manager.can_swap_out(seq):
            return
        copies_before = list(step.ops.copies)  # (swap-outs run before every copy of the step)
        table = list(self.manager.block_table(seq))
        ops = self.manager.swap_out(seq)
        step.ops.extend(ops)
        step.released(seq, (ops.swap_outs, copies_before), table)
        del self.h.live[seq.request_id]
        self.h.swapped[seq.request_id] = seq

    def _swap_in(self, step: _Step, seq: Request) -> None:
        can = self.manager.can_swap_in(seq)
        ops = self.manager.swap_in(seq)
        assert can == (ops is not None)
        if ops is None:
            return
        step.ops.extend(ops)
        step.calls.append(("swap_in", seq, ops.swap_ins, list(self.manager.block_table(seq))))
        del self.h.swapped[seq.request_id]
        self.h.live[seq.request_id] = seq

    # ------------------------------------------------------------------ the shadow
    def _execute(self, step: _Step) -> None:
        """Carry out the step's MemOps on the shadow, tell it what the step decided, in
        decision order, and compute the tokens allocated; then check everything."""
        shadow, h = self.h.shadow, self.h
        self.cached.end_step()
        shadow.execute(step.ops)  # (the shadow checks content when the step is told, after)
        for kind, seq, *rest in step.calls:
            live = seq.request_id in h.live  # at the end of the step
            if kind == "fork":
                child, table = rest
                if child.request_id in h.live:
                    shadow.forked(seq, child, table)
            elif kind == "release":
                if rest[0] is None:
                    shadow.freed(seq)
                else:
                    shadow.swapped_out(seq, rest[0][0], copies=rest[0][1])
            elif kind == "swap_in" and live:  # (else freed later in the step)
                shadow.swapped_in(seq, *rest)
            elif kind == "allocate":
                self._allocated(seq, *rest)
        h.check()
        self.manager.check_tiers()

    def _allocated(self, seq: Request, start: int, num_new: int, known: list,
                   copies: list[tuple[int, int]], released: list[int] | None) -> None:
        """Tell the shadow of an allocation, and compute its tokens unless the sequence was
        `released` later in the step (then holding that table)."""
        shadow = self.h.shadow
        if seq.request_id in shadow.seqs:
            table = list(self.manager.block_table(seq)) if released is None else released
            shadow.grew(seq, copies, table)
        elif released is None:
            shadow.admitted(seq, start)
        if released is not None:
            return
        computed(seq, start, num_new)
        shadow.wrote(seq, start, start + num_new)
        self.cached.check_filled(seq, start, num_new, known)
