"""The hybrid manager (KV-cache groups) driven as an engine drives it: several calls a step in
any order, their MemOps carried out together at the step's end in MemOps order (tier writes,
swap-outs, copies, swap-ins, tier loads), then the tokens allocated computed. After every
step, every group's pages are checked against the content model of `test_hybrid_manager`
(a prefix hit's pages hold its own content, a window's pages are present, no page lost or
twice); a call the step-order rules refuse (`StepOrderError`) must change nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.policies import KVCacheManager, MemOps, Request, StepOrderError
from kvlab.policies.tiers import build_tiers
from kvlab.specs.kv_groups import NULL_PAGE, parse_groups
from tests.policies.test_hybrid_manager import (
    ALLOCATIONS,
    LAYOUTS,
    PAGE,
    Admissions,
    Model,
    _spec,
    unit_tier_configs,
)


class SteppedModel(Model):
    """`Model` with the calls of a step decided first and carried out together at its end."""

    def __init__(self, manager: KVCacheManager) -> None:
        super().__init__(manager)
        self.ops = MemOps()
        self.pending: list[tuple[Request, int, int, bool]] = []  # seq, start, tokens, new
        self.touched: set[int] = set()  # ids given memory in the step (once a step)

    def begin(self) -> None:
        self.m.begin_step()
        self.ops, self.pending, self.touched = MemOps(), [], set()

    def end(self) -> None:
        """The step's work: MemOps in their order, then the tokens, then the checks."""
        after = MemOps()
        self.m.end_step(after)
        ops = self.ops
        self.copy_levels(after.tier_writes)
        for src, dst in ops.swap_outs:
            self.host[dst] = self.content.get(src)
        values = [self.content.get(src) for src, _ in ops.copies]
        for (_, dst), value in zip(ops.copies, values, strict=True):
            self.content[dst] = value
        for src, dst in ops.swap_ins:
            self.content[dst] = self.host[src]
        self.copy_levels(ops.tier_loads)
        computed = [(seq, start, n, new) for seq, start, n, new in self.pending
                    if seq.request_id in self.live]
        for seq, start, num_new, _ in computed:
            self.write(seq, start, num_new)
        for seq, start, _, new in computed:
            if new:  # a hit's pages hold its own content (loads and the step's writes done:
                self.check_hit(seq, start)  # a hit may be on pages computed in this step)
        self.check()
        self.m.check_tiers()

    def check_hit(self, seq: Request, num_hit: int) -> None:
        for group, table in enumerate(self.m.block_tables(seq)):
            keys = self.keys(seq, group)
            for index, page in enumerate(table[: num_hit // PAGE]):
                if page != NULL_PAGE:
                    assert self.content.get(page) == keys[index], "a hit page holds other KV"

    def allocate(self, seq: Request, num_new: int, *, new: bool) -> bool:
        if seq.request_id in self.touched:
            return False
        start = seq.num_computed_tokens
        if new:
            start = seq.num_computed_tokens = self.m.num_computed_prefix_tokens(seq)
            num_new = min(num_new, seq.prompt_len - start)
        can = self.m.can_allocate(seq, num_new)
        ops = self.m.allocate(seq, num_new)
        assert can == (ops is not None)
        if ops is None:
            if new:
                seq.num_computed_tokens = 0
            return False
        self.ops.extend(ops)
        self.pending.append((seq, start, num_new, new))
        self.touched.add(seq.request_id)
        self.live[seq.request_id] = seq
        return True

    def held_by_others(self, seq: Request) -> set[int]:
        """Pages other live sequences hold, but for those a sequence admitted in this step
        took as a hit before their KV was computed (computed in this step, by `seq`)."""
        fresh_hits = {page for other, start, _, new in self.pending
                      if new and other is not seq and other.request_id in self.live
                      for table in self.m.block_tables(other) for page in table[: start // PAGE]}
        return super().held_by_others(seq) - fresh_hits

    def guarded(self, call, seq: Request) -> bool:
        """A call the step-order rules may refuse: refused, it changed nothing."""
        before = self.m.usage(), self.m.block_tables(seq)
        try:
            call()
        except StepOrderError:
            assert (self.m.usage(), self.m.block_tables(seq)) == before, \
                "a refused call changed memory"
            return False
        return True

    def free_now(self, seq: Request) -> None:
        if self.guarded(lambda: self.m.free(seq), seq):
            self.released(seq)

    def released(self, seq: Request) -> None:
        """The sequence let its pages go: its allocation of the step is never computed."""
        self.live.pop(seq.request_id, None)
        self.pending = [item for item in self.pending if item[0] is not seq]

    def swap_out_now(self, seq: Request) -> bool:
        if not self.m.can_swap_out(seq):
            return False

        def swap() -> None:
            self.ops.extend(self.m.swap_out(seq))
        if not self.guarded(swap, seq):
            return False
        self.released(seq)
        return True

    def swap_in_now(self, seq: Request) -> bool:
        ops = self.m.swap_in(seq)
        if ops is None:
            return False
        self.ops.extend(ops)
        self.live[seq.request_id] = seq
        self.touched.add(seq.request_id)
        return True

    def fork_now(self, parent: Request, child: Request) -> bool:
        def fork() -> None:
            self.m.fork(parent, child)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_output_tokens = parent.num_output_tokens
        if not self.guarded(fork, parent):
            return False
        self.live[child.request_id] = child
        self.touched.add(child.request_id)
        return True


calls = st.tuples(st.sampled_from(["admit", "admit", "grow", "grow", "free", "swap", "swap_in",
                                   "fork", "preempt"]),
                  st.integers(0, 1), st.integers(0, 14), st.integers(1, 12))
step_programs = st.lists(st.lists(calls, min_size=1, max_size=5), min_size=1, max_size=14)


@settings(max_examples=3 * settings.default.max_examples)
@given(layout=st.sampled_from(LAYOUTS), num_pages=st.integers(12, 48),
       caching=st.sampled_from([True, True, False]), retention=st.sampled_from([None, 0, 8]),
       allocation=st.sampled_from(ALLOCATIONS), tiered=st.booleans(),
       tier_config=unit_tier_configs(), steps=step_programs)
def test_any_order_of_calls_within_a_step_keeps_each_groups_content(
        layout, num_pages, caching, retention, allocation, tiered, tier_config, steps):
    tiered = tiered and caching
    spec = _spec(allocation, "block_size=4,preemption=swap" + (",eviction=lru" if caching else ""))
    tiers = build_tiers(tier_config, page_size=PAGE, page_bytes=1) if tiered else None
    manager = KVCacheManager(spec, num_pages, max_model_len=128, groups=parse_groups(layout),
                             retention_interval=retention, tiers=tiers,
                             tier_config=tier_config if tiered else None)
    model = SteppedModel(manager)
    admissions = Admissions()
    swapped: list[Request] = []
    for calls_of_step in steps:
        model.begin()
        for op, family, suffix, amount in calls_of_step:
            live = [seq for seq in model.live.values() if seq.request_id not in model.touched]
            if op == "swap_in" and swapped:
                if model.swap_in_now(swapped[0]):
                    swapped.pop(0)
            elif op == "admit" or not live:
                admissions.admit(op, family, suffix, amount,
                                 lambda seq, n: model.allocate(seq, n, new=True))
            else:
                seq = live[family % len(live)]
                held = list(model.live.values())  # (grown in the step too: never computed)
                if op in ("free", "swap", "fork", "preempt"):
                    seq = held[(family + suffix) % len(held)]
                if op == "free":
                    model.free_now(seq)
                elif op == "swap":
                    if model.swap_out_now(seq):
                        swapped.append(seq)
                elif op == "fork":
                    child = Request(admissions.next_id, seq.prompt_len, seq.max_output_tokens,
                                    prompt_token_ids=seq.prompt_token_ids)
                    admissions.next_id += model.fork_now(seq, child)
                elif op == "preempt":
                    model.free_now(seq)
                    if seq.request_id not in model.live:
                        seq.num_computed_tokens = seq.num_output_tokens = 0
                        admissions.waiting.append(seq)
                elif seq.num_computed_tokens < seq.prompt_len:
                    model.allocate(seq, min(amount, seq.prompt_len - seq.num_computed_tokens),
                                   new=False)
                elif seq.num_computed_tokens < seq.total_len - 1:
                    model.allocate(seq, 1, new=False)
                else:
                    model.free_now(seq)
        model.end()
    model.begin()
    for seq in list(model.live.values()):
        model.free_now(seq)
    for seq in swapped:
        manager.free(seq)
    model.end()
    assert manager.num_used_pages == 0
    assert manager.host.num_used_pages == 0
