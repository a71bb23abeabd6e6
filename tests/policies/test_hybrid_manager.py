"""The hybrid manager (KV-cache groups) against an independent model of what each page holds.

A program of admissions (with their prefix hits), chunks, decodes, preemptions and frees runs
on random group layouts; after every call: every page is free, cached-free or held (none lost
or twice), owner counts match the tables, a window's pages are all present, a page taken as a
prefix hit holds exactly the content its key names, and a hit is the longest valid in every
group.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.policies import KVCacheManager, MemOps, Request, RequestStatus, SchedulerConfig
from kvlab.policies.hybrid_manager import HybridKVCacheManager
from kvlab.policies.tiers import TiersConfig, TierSpec, build_tiers
from kvlab.specs.kv_groups import NULL_PAGE, KVCacheGroup, parse_groups
from tests.policies.test_scheduler_properties import run_workload
from tests.policies.test_tiers_shadow import EVICTIONS

PAGE = 4
LAYOUTS = ["sliding_window(8),full", "chunked_local(8),full", "state,full",
           "sliding_window(5),sliding_window(12),full", "sliding_window(8)", "full,state"]
FAMILIES = [list(range(100 * f, 100 * f + 24)) for f in range(1, 3)]


def family_request(request_id: int, family: int, suffix: int, num_output: int) -> Request:
    """A request whose prompt is one of FAMILIES' shared prefixes and `suffix` tokens of its
    own."""
    ids = FAMILIES[family] + list(range(9000 + request_id * 16, 9000 + request_id * 16 + suffix))
    return Request(request_id, len(ids), num_output, prompt_token_ids=ids)


class Admissions:
    """A program's requests to admit: the waiting one first, unless the call asks for a new
    one of a family (`family_request`); one the manager refuses waits."""

    def __init__(self) -> None:
        self.waiting: list[Request] = []
        self.next_id = 0

    def admit(self, op: str, family: int, suffix: int, amount: int, admit) -> None:
        """Admit the next request with `admit(request, num_new_tokens) -> bool`."""
        if self.waiting and op != "admit":
            seq = self.waiting.pop(0)
        else:
            seq = family_request(self.next_id, family, suffix, amount)
            self.next_id += 1
        if not admit(seq, amount * 4):
            self.waiting.append(seq)


class Model:
    """What each page holds (the key of the content last written to it), from the tables
    the manager hands out and the tokens computed into them."""

    def __init__(self, manager: HybridKVCacheManager) -> None:
        self.m = manager
        self.content: dict[int, object] = {}
        self.host: dict[int, object] = {}  # host page -> content (swap)
        self.live: dict[int, Request] = {}
        # level -> page -> content: the device (`content`) and each memory tier below it
        self.levels: dict[int, dict[int, object]] = {0: self.content}

    def step(self, call):
        """`call` as a step of its own: the tier writes decided in it are carried out first,
        reading the device pages before anything else of the step writes them."""
        self.m.begin_step()
        ops = call()
        after = MemOps()
        self.m.end_step(after)
        self.copy_levels(after.tier_writes)
        return ops

    def copy_levels(self, batches) -> None:
        """Carry out tier writes or loads, each batch read whole before it writes."""
        for src_level, src_pages, dst_level, dst_pages in batches:
            src = self.levels.setdefault(src_level, {})
            dst = self.levels.setdefault(dst_level, {})
            values = [src.get(page) for page in src_pages]
            for page, value in zip(dst_pages, values, strict=True):
                dst[page] = value

    def keys(self, seq: Request, group: int) -> list:
        hashes = seq.page_hashes(PAGE)
        first_full = next(i for i, g in enumerate(self.m.groups) if g.kind == "full") \
            if any(g.kind == "full" for g in self.m.groups) else None
        return hashes if group == first_full else [(group, key) for key in hashes]

    def admit(self, seq: Request, num_new: int) -> bool:
        def lookup_and_allocate() -> MemOps | None:  # (in one step: a step's start may
            seq.num_computed_tokens = self.m.num_computed_prefix_tokens(seq)  # write through)
            return self.m.allocate(seq, min(num_new, seq.prompt_len - seq.num_computed_tokens))

        ops = self.step(lookup_and_allocate)
        hit = seq.num_computed_tokens
        if ops is None:
            seq.num_computed_tokens = 0
            return False
        self.copy_levels(ops.tier_loads)
        for group, table in enumerate(self.m.block_tables(seq)):
            keys = self.keys(seq, group)
            for index, page in enumerate(table[: hit // PAGE]):
                if page != NULL_PAGE:
                    assert self.content.get(page) == keys[index], "a hit page holds other KV"
        self.live[seq.request_id] = seq
        self.write(seq, hit, min(num_new, seq.prompt_len - hit))
        return True

    def grow(self, seq: Request, num_new: int) -> bool:
        start = seq.num_computed_tokens
        if self.step(lambda: self.m.allocate(seq, num_new)) is None:
            return False
        self.write(seq, start, num_new)
        return True

    def write(self, seq: Request, start: int, num_new: int) -> None:
        """Tokens [start, start + num_new) computed into every group's pages."""
        end = start + num_new
        for group, table in enumerate(self.m.block_tables(seq)):
            keys = self.keys(seq, group)
            aligned = self.m.groups[group].kind == "state" and self.m.caching
            if aligned:  # the state it starts from, and the one it ends at (see windowed.py)
                assert table[-(-end // PAGE) - 1] != NULL_PAGE, "no page for the state"
                assert not start or table[(start - 1) // PAGE] != NULL_PAGE, \
                    "the state a chunk starts from was given back"
            else:
                assert NULL_PAGE not in table[self.first_read(group, start) // PAGE :], \
                    "a page the first new token reads was given back"
            if self.m.groups[group].kind == "state" and not self.m.caching:
                assert len(table) == 1, "a state group holds one page per request"
                assert table[0] not in self.held_by_others(seq), "a write into a shared state"
                self.content[table[0]] = None  # the state, updated in place
                continue
            for index in range(start // PAGE, -(-end // PAGE)):
                page = table[index]
                if aligned and page == NULL_PAGE:
                    continue  # (a boundary inside a chunk: its state never kept)
                assert page != NULL_PAGE, "a token is written into a given-back page"
                assert page not in self.held_by_others(seq), "a write into a shared page"
                self.content[page] = self.page_content(seq, keys, index, end)
        if end > seq.prompt_len:
            seq.num_output_tokens = end - seq.prompt_len
        seq.num_computed_tokens = end

    @staticmethod
    def page_content(seq: Request, keys: list, index: int, num_tokens: int) -> object:
        """What page `index` of a sequence with `num_tokens` computed holds: its key when full
        and keyed; else its prompt up to there and how many of its slots are written."""
        end = min(num_tokens, (index + 1) * PAGE)
        if end == (index + 1) * PAGE and index < len(keys):
            return keys[index]
        return ("tokens", hash(tuple(seq.prompt_token_ids[:end])), end - index * PAGE)

    def held_by_others(self, seq: Request) -> set[int]:
        return {page for other in self.live.values() if other is not seq
                for table in self.m.block_tables(other) for page in table}

    def fork(self, parent: Request, child: Request) -> None:
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_output_tokens = parent.num_output_tokens
        self.step(lambda: self.m.fork(parent, child))
        self.live[child.request_id] = child

    def first_read(self, group: int, position: int) -> int:
        """The first token the token at `position` reads in `group` (a state group: the state
        after the token before it)."""
        kind = self.m.groups[group]
        if kind.kind == "state":
            return max(0, position - 1) if self.m.caching else 0
        return kind.num_skipped_tokens(position)

    def free(self, seq: Request) -> None:
        self.step(lambda: self.m.free(seq))
        del self.live[seq.request_id]

    def swap_out(self, seq: Request) -> bool:
        if not self.m.can_swap_out(seq):
            return False
        ops = self.step(lambda: self.m.swap_out(seq))
        for page, host_page in ops.swap_outs:
            self.host[host_page] = self.content.get(page)
        del self.live[seq.request_id]
        return True

    def swap_in(self, seq: Request) -> bool:
        ops = self.step(lambda: self.m.swap_in(seq))
        if ops is None:
            return False
        for host_page, page in ops.swap_ins:
            self.content[page] = self.host[host_page]
        self.live[seq.request_id] = seq
        for group, table in enumerate(self.m.block_tables(seq)):
            assert NULL_PAGE not in table[self.first_read(group, seq.num_computed_tokens)
                                          // PAGE :], "a swapped-in window lacks a page"
        return True

    def check(self) -> None:
        m = self.m
        for seq in self.live.values():  # every computed token's KV where its tables say
            for group, table in enumerate(m.block_tables(seq)):
                if m.groups[group].kind == "state" and not m.caching:
                    continue  # (one state, updated in place)
                keys = self.keys(seq, group)
                done = seq.num_computed_tokens
                for index in range(-(-done // PAGE)):
                    want = self.page_content(seq, keys, index, done)
                    assert table[index] == NULL_PAGE or self.content.get(table[index]) == want, \
                        f"seq {seq.request_id}: the KV of its page {index} is lost"
        held: dict[int, int] = {}
        for seq in self.live.values():
            for table, manager in zip(m.block_tables(seq), m.group_managers, strict=True):
                state = manager.seqs[seq.request_id]
                assert table[: state.num_null_pages] == [NULL_PAGE] * state.num_null_pages
                if not getattr(manager, "aligned", False):  # (see windowed.py)
                    assert NULL_PAGE not in table[state.num_null_pages :]
                for page in table:
                    if page != NULL_PAGE:
                        held[page] = held.get(page, 0) + 1
        assert m.pool.owners == {page: n for page, n in held.items() if n > 1}
        cached_free = set(m.evictor.pages())
        assert not cached_free & held.keys(), "a held page is cached-free"
        assert m.num_free_pages + len(cached_free) + len(held) == m.num_total_pages, \
            "a page is lost or counted twice"
        assert set(m.pool.cached.values()) <= cached_free | held.keys()
        assert cached_free <= set(m.pool.cached.values())
        assert sum(m.pages_held_by_group()) == sum(held.values())


# (admissions and frees weighted up: prefix hits need a family's pages computed and cached)
programs = st.lists(st.tuples(st.sampled_from(["admit", "admit", "grow", "decode", "free",
                                               "free", "preempt", "swap", "fork"]),
                              st.integers(0, 1), st.integers(0, 14), st.integers(1, 12)),
                    min_size=1, max_size=40)


# every allocation and block-sizing family (a full group's blocks; windows take pages)
ALLOCATIONS = ["paged", "paged", "paged:block_sizing=geometric", "buddy",
               "buddy:block_sizing=geometric", "contiguous:reserve=pow2",
               "contiguous:reserve=oracle", "contiguous:reserve=max"]


def _spec(allocation: str, options: str) -> str:
    """A policy spec of `allocation` (with or without its own options) and more options."""
    return f"{allocation}{',' if ':' in allocation else ':'}{options}"


@settings(max_examples=3 * settings.default.max_examples)
@given(layout=st.sampled_from(LAYOUTS), num_pages=st.integers(12, 60),
       caching=st.sampled_from([True, True, True, False]),
       retention=st.sampled_from([None, 0, 8, 16]), allocation=st.sampled_from(ALLOCATIONS),
       program=programs)
def test_hybrid_manager_keeps_pages_and_contents(layout, num_pages, caching, retention,
                                                 allocation, program):
    spec = _spec(allocation, "block_size=4,preemption=swap" + (",eviction=lru" if caching else ""))
    manager = KVCacheManager(spec, num_pages, max_model_len=128, groups=parse_groups(layout),
                             retention_interval=retention)
    run_program(manager, program)


@st.composite
def unit_tier_configs(draw) -> TiersConfig:
    """One to three tiers of one device page per tier page, any eviction, write policy and
    reuse threshold."""
    kinds = draw(st.sampled_from([["host"], ["host", "ssd"], ["host", "ssd", "remote"]]))
    tiers = tuple(TierSpec(kind, size_pages=draw(st.integers(1, 24)),
                           eviction=draw(st.sampled_from(EVICTIONS))) for kind in kinds)
    return TiersConfig(tiers, write_policy=draw(st.sampled_from(["write-back", "write-through"])),
                       store_threshold=draw(st.sampled_from([0, 0, 1, 2])))


@settings(max_examples=3 * settings.default.max_examples)
@given(layout=st.sampled_from(LAYOUTS), num_pages=st.integers(12, 40),
       retention=st.sampled_from([None, 0, 8]), tier_config=unit_tier_configs(),
       eviction=st.sampled_from(EVICTIONS), program=programs)
def test_tier_hits_bring_each_groups_content_back(layout, num_pages, retention, tier_config,
                                                  eviction, program):
    tiers = build_tiers(tier_config, page_size=PAGE, page_bytes=1)
    manager = KVCacheManager(f"paged:block_size=4,preemption=swap,eviction={eviction}",
                             num_pages, max_model_len=128, groups=parse_groups(layout),
                             retention_interval=retention, tiers=tiers, tier_config=tier_config)
    run_program(manager, program)


def run_program(manager: KVCacheManager, program: list) -> None:
    """Run `program` on the manager, checked by the model after every call; then free all."""
    assert isinstance(manager, HybridKVCacheManager)
    model = Model(manager)
    admissions = Admissions()
    swapped: list[Request] = []
    for op, family, suffix, amount in program:
        live = list(model.live.values())
        if swapped and op == "admit" and family:
            if model.swap_in(swapped[0]):
                swapped.pop(0)
        elif op == "admit" or not live:
            admissions.admit(op, family, suffix, amount, model.admit)
        else:
            seq = live[family % len(live)]
            if op == "free":
                model.free(seq)
            elif op == "swap":
                if model.swap_out(seq):
                    swapped.append(seq)
            elif op == "fork":
                model.fork(seq, Request(admissions.next_id, seq.prompt_len,
                                        seq.max_output_tokens,
                                        prompt_token_ids=seq.prompt_token_ids))
                admissions.next_id += 1
            elif op == "preempt":
                model.free(seq)
                seq.num_computed_tokens = seq.num_output_tokens = 0
                admissions.waiting.append(seq)
            elif seq.num_computed_tokens < seq.prompt_len:
                model.grow(seq, min(amount, seq.prompt_len - seq.num_computed_tokens))
            elif seq.num_computed_tokens < seq.total_len - 1:
                model.grow(seq, 1)
            else:
                model.free(seq)
        model.check()
        manager.check_tiers()
    for seq in list(model.live.values()) + swapped:
        if seq.request_id in model.live:
            model.free(seq)
        else:
            manager.free(seq)
    model.check()
    assert manager.num_used_pages == 0
    assert manager.host.num_used_pages == 0


def test_sliding_window_gives_back_pages_behind_the_window():
    manager = KVCacheManager("paged:block_size=4", 64, max_model_len=256,
                             groups=parse_groups("sliding_window(8),full"))
    seq = Request(1, 30, 20)
    manager.allocate(seq, 30)
    seq.num_computed_tokens = 30
    for _ in range(10):
        manager.allocate(seq, 1)
        seq.num_computed_tokens += 1
    sliding, full = manager.block_tables(seq)
    # token 40 reads tokens 33..40: pages 8.. (page 8 holds 32..35); 0..7 given back
    assert sliding[:8] == [NULL_PAGE] * 8 and NULL_PAGE not in sliding[8:]
    assert NULL_PAGE not in full and len(full) == 10
    assert manager.num_pages_held(seq) == 12


def test_a_prefix_hit_needs_the_window_cached_in_every_group():
    ids = list(range(40))
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 64, max_model_len=256,
                             groups=parse_groups("sliding_window(8),full"))
    first = Request(1, 40, 2, prompt_token_ids=ids)
    manager.allocate(first, 40)
    first.num_computed_tokens = 40
    manager.free(first)
    again = Request(2, 40, 2, prompt_token_ids=ids)
    assert manager.num_computed_prefix_tokens(again) == 36  # the last token is computed
    sliding_keys = [(0, key) for key in again.page_hashes(4)]
    del manager.pool.cached[sliding_keys[8]]  # the window of a 36-token hit lacks page 8
    # the longest hit valid in both groups ends before page 8: pages 6 and 7 hold its window
    assert manager.num_computed_prefix_tokens(again) == 32


def test_the_retention_interval_registers_only_the_windows_a_hit_can_use():
    ids = list(range(64))

    def cached_sliding_pages(retention: int | None) -> int:
        manager = KVCacheManager("paged:block_size=4,eviction=lru", 64, max_model_len=256,
                                 groups=parse_groups("sliding_window(5),full"),
                                 retention_interval=retention)
        seq = Request(1, 64, 20, prompt_token_ids=ids)
        manager.allocate(seq, 64)
        seq.num_computed_tokens = 64
        for _ in range(19):
            manager.allocate(seq, 1)
            seq.num_computed_tokens += 1
        return sum(1 for key in manager.pool.cached if isinstance(key, tuple))

    # window 5 needs one page before a hit. None (dense): all 16 prompt pages; 0 (vLLM's
    # default): the page before the prompt's last hit (token 63: page 15, so page 14); 16: that
    # and the pages before 16, 32, 48 and 64 tokens (3, 7, 11, 15)
    assert cached_sliding_pages(None) == 16
    assert cached_sliding_pages(0) == 1
    assert cached_sliding_pages(16) == 5


def test_unsupported_combinations_are_refused():
    groups = [KVCacheGroup("sliding_window", 1, 8), KVCacheGroup()]
    with pytest.raises(KvlabError, match="retention"):
        KVCacheManager("paged", 64, max_model_len=64, groups=groups, retention_interval=6)


def test_one_full_group_is_the_plain_manager():
    manager = KVCacheManager("paged", 64, max_model_len=64, groups=[KVCacheGroup("full", 32)])
    assert type(manager) is KVCacheManager


@st.composite
def hybrid_workloads(draw):
    """A scheduler workload on a hybrid manager: shared prompt prefixes, memory for one to three
    of the largest requests, budgets that chunk prompts."""
    groups = parse_groups(draw(st.sampled_from(LAYOUTS)))
    caching = draw(st.booleans())
    retention = draw(st.sampled_from([None, 0, 8])) if caching else None
    whole = 128 // PAGE
    num_pages = draw(st.integers(whole // 2, 2 * whole)) * len(groups)
    budget = draw(st.integers(4, 64))
    requests = []
    for request_id in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, 90))
        family = FAMILIES[draw(st.integers(0, 1))]
        ids = [family[i % len(family)] for i in range(prompt)]
        requests.append(Request(request_id, prompt, draw(st.integers(1, 40)),
                                arrival_s=draw(st.integers(0, 20)) / 100,
                                prompt_token_ids=ids))
    config = SchedulerConfig(max_num_seqs=draw(st.integers(1, 8)),
                             max_num_batched_tokens=budget, max_model_len=128,
                             enable_chunked_prefill=True)
    spec = _spec(draw(st.sampled_from(ALLOCATIONS)),
                 f"block_size=4,preemption={draw(st.sampled_from(['recompute', 'swap']))}"
                 + (",eviction=lru" if caching else ""))
    return spec, num_pages, config, requests, groups, retention


@given(workload=hybrid_workloads())
def test_the_scheduler_serves_every_request_that_fits_on_a_hybrid_manager(workload):
    spec, num_pages, config, requests, groups, retention = workload
    manager, _ = run_workload(spec, num_pages, config, requests, groups=groups,
                              retention_interval=retention)
    for request in requests:
        if request.total_len <= 128 and manager.pages_needed_alone(request) <= num_pages:
            assert request.status is RequestStatus.FINISHED_LENGTH
        else:
            assert request.status is RequestStatus.FINISHED_ERROR
    assert manager.num_used_pages == 0
    assert manager.num_free_pages + manager.num_cached_free_pages == num_pages
