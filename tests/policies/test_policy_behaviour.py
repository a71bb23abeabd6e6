"""One distinctive behaviour of each policy, on hand-made cases."""

from __future__ import annotations

import json

import pytest

from kvlab.errors import KvlabError
from kvlab.policies import (
    KVCacheManager,
    PolicySpec,
    Request,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    parse_policy,
)
from kvlab.policies.allocation.buddy import BuddyAllocator
from kvlab.policies.allocation.contiguous import ContiguousAllocator
from kvlab.policies.eviction.cost import CostAwareEviction
from kvlab.policies.eviction.fifo import FIFOEviction
from kvlab.policies.eviction.lfu import LFUEviction
from kvlab.policies.eviction.lru import LRUEviction


def _admit(manager: KVCacheManager, seq: Request) -> None:
    seq.num_computed_tokens = manager.num_computed_prefix_tokens(seq)
    assert manager.allocate(seq, seq.num_tokens - seq.num_computed_tokens) is not None
    seq.num_computed_tokens = seq.num_tokens


# ---------------------------------------------------------------- specs


def test_spec_string_round_trips_through_json():
    spec = parse_policy("paged:block_size=32,eviction=lru,preemption=swap,host_pages=100")
    assert parse_policy(spec.to_string()) == spec
    assert PolicySpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert spec.to_string() == "paged:block_size=32,eviction=lru,preemption=swap,host_pages=100"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slab", "valid kinds: buddy, contiguous, paged"),
        ("paged:blocksize=16", "valid keys: block_size"),
        ("paged:eviction=mru", "valid: "),
        ("paged:block_size=big", "block_size='big' is not a whole number"),
        ("paged:watermark=2", "must be in [0, 1)"),
        ("contiguous:block_sizing=geometric", "does not apply to contiguous"),
        ("paged:lru", "is not key=value"),
    ],
)
def test_bad_spec_names_the_problem_and_the_choices(text, expected):
    with pytest.raises(KvlabError, match=None) as err:
        parse_policy(text)
    assert expected in str(err.value)


def test_bad_eviction_lists_every_registered_choice():
    with pytest.raises(KvlabError) as err:
        parse_policy("paged:eviction=mru")
    for name in ("none", "lru", "fifo", "lfu", "cost", "arc", "slru"):
        assert name in str(err.value)


# ---------------------------------------------------------------- eviction order


def test_lru_evicts_the_page_released_longest_ago():
    lru = LRUEviction()
    for page in (3, 1, 2):
        lru.add(page, depth=0, key=-page)
    lru.remove(1)
    lru.add(1, depth=0, key=-1)  # reused and released again: now the most recent
    assert [lru.pop_victim() for _ in range(3)] == [(3, -3), (2, -2), (1, -1)]


def test_fifo_ignores_reuse():
    fifo = FIFOEviction()
    for page in (3, 1, 2):
        fifo.add(page, depth=0, key=-page)
    fifo.remove(3)
    fifo.add(3, depth=0, key=-3)
    assert [fifo.pop_victim() for _ in range(3)] == [(3, -3), (1, -1), (2, -2)]


def test_lfu_keeps_the_hot_page():
    lfu = LFUEviction()
    for page in (1, 2, 3):
        lfu.add(page, depth=0, key=-page)
    lfu.remove(1)
    lfu.on_hit(1)
    lfu.add(1, depth=0, key=-1)
    assert [lfu.pop_victim() for _ in range(3)] == [(2, -2), (3, -3), (1, -1)]


def test_cost_eviction_drops_shallow_cold_pages_first():
    cost = CostAwareEviction()
    cost.add(10, depth=5, key=-10)
    cost.add(11, depth=0, key=-11)
    cost.add(12, depth=2, key=-12)
    assert [cost.pop_victim() for _ in range(3)] == [(11, -11), (12, -12), (10, -10)]


def test_lru_manager_releases_a_prompt_tail_first():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 8, max_model_len=64)
    seq = Request(0, 13, 1, prompt_token_ids=list(range(13)))
    _admit(manager, seq)
    table = list(manager.block_table(seq))
    manager.free(seq)
    # three full prompt pages are cached; the deepest one is the first to go
    assert manager.evictor.pages() == [table[2], table[1], table[0]]


# ---------------------------------------------------------------- prefix caching


def test_prefix_hit_is_capped_below_the_prompt_length():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 16, max_model_len=64)
    first = Request(0, 8, 2, prompt_token_ids=list(range(8)))
    _admit(manager, first)
    twin = Request(1, 8, 2, prompt_token_ids=list(range(8)))
    # both pages are cached, but the last token must be computed: one page is a hit
    assert manager.num_computed_prefix_tokens(twin) == 4
    longer = Request(2, 9, 2, prompt_token_ids=list(range(9)))
    assert manager.num_computed_prefix_tokens(longer) == 8


def test_shared_prefix_pages_are_reference_counted():
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 16, max_model_len=64)
    a = Request(0, 9, 2, prompt_token_ids=list(range(9)))
    b = Request(1, 9, 2, prompt_token_ids=list(range(9)))
    _admit(manager, a)
    _admit(manager, b)
    shared = manager.block_table(a)[:2]
    assert manager.block_table(b)[:2] == shared
    assert [manager.num_owners(p) for p in shared] == [2, 2]
    manager.free(a)
    assert [manager.num_owners(p) for p in shared] == [1, 1]
    assert manager.usage().num_live_token_slots == 9


def test_repeated_hash_ids_and_empty_blocks_are_refused():
    with pytest.raises(ValueError, match="repeat"):
        Request(0, 1024, 1, hash_ids=(7, 7))
    with pytest.raises(ValueError, match="hash_block_size"):
        Request(0, 1024, 1, hash_ids=(7,), hash_block_size=0)


def test_one_hash_id_at_two_positions_shares_nothing():
    # KV depends on the position: block 8 second in one prompt, first in the other
    manager = KVCacheManager("paged:block_size=16,eviction=lru", 64, max_model_len=2048)
    a = Request(0, 256, 1, hash_ids=(7, 8), hash_block_size=128)
    b = Request(1, 200, 1, hash_ids=(8,), hash_block_size=128)
    _admit(manager, a)
    assert set(a.page_hashes(16)).isdisjoint(b.page_hashes(16))
    assert manager.num_computed_prefix_tokens(b) == 0


def test_trace_hash_ids_share_pages_of_any_size():
    manager = KVCacheManager("paged:block_size=16,eviction=lru", 64, max_model_len=2048)
    a = Request(0, 600, 1, hash_ids=(7, 8), hash_block_size=512)
    b = Request(1, 700, 1, hash_ids=(7, 9), hash_block_size=512)
    _admit(manager, a)
    assert manager.num_computed_prefix_tokens(b) == 512


# ---------------------------------------------------------------- contiguous reservation


@pytest.mark.parametrize(("reserve", "pages"), [("max", 32), ("pow2", 8), ("oracle", 5)])
def test_contiguous_reserves_max_pow2_or_oracle(reserve, pages):
    manager = KVCacheManager(f"contiguous:block_size=16,reserve={reserve}", 64, max_model_len=512)
    seq = Request(0, 60, 20)  # 80 tokens: 5 pages exactly, 128 tokens = 8 pages as pow2
    _admit(manager, seq)
    table = manager.block_table(seq)
    assert len(table) == pages
    assert table == list(range(table[0], table[0] + pages))  # one contiguous run


def test_contiguous_suffers_external_fragmentation():
    allocator = ContiguousAllocator(10)
    a, b, c = allocator.allocate(3), allocator.allocate(3), allocator.allocate(3)
    allocator.release(a)
    allocator.release(c)
    # 7 pages free, but no run of 5
    assert allocator.num_free_pages == 7
    assert allocator.allocate(5) is None
    assert allocator.num_unusable_free_pages() == 3
    allocator.release(b)
    assert allocator.allocate(10) == list(range(10))


# ---------------------------------------------------------------- buddy


def test_buddy_splits_and_merges():
    buddy = BuddyAllocator(16)
    one = buddy.allocate(1)
    assert one == [0]
    # splitting 16 left free blocks of 1, 2, 4 and 8 pages
    assert [sorted(s) for s in buddy._free] == [[1], [2], [4], [8], []]
    three = buddy.allocate(3)  # rounded up to 4
    assert three == [4, 5, 6, 7]
    buddy.release(one)
    buddy.release(three)
    assert [sorted(s) for s in buddy._free] == [[], [], [], [], [0]]
    assert buddy.num_free_pages == 16


def test_buddy_manager_takes_power_of_two_blocks():
    manager = KVCacheManager("buddy:block_size=4,block_sizing=predicted", 32, max_model_len=64)
    seq = Request(0, 10, 10)  # 20 tokens: 5 pages predicted, rounded to an 8-page block
    _admit(manager, seq)
    assert len(manager.block_table(seq)) == 8
    assert manager.usage().num_internal_frag_slots == 8 * 4 - 10


# ---------------------------------------------------------------- block sizing


def test_geometric_blocks_double_but_never_pass_the_request_length():
    manager = KVCacheManager("paged:block_size=1,block_sizing=geometric", 64, max_model_len=64)
    seq = Request(0, 1, 9)  # at most 10 tokens
    _admit(manager, seq)
    sizes = [len(manager.block_table(seq))]
    while seq.num_tokens < seq.total_len:
        assert manager.allocate(seq, 1) is not None
        seq.num_computed_tokens += 1
        seq.num_output_tokens += 1
        sizes.append(len(manager.block_table(seq)))
    assert sorted(set(sizes)) == [1, 3, 7, 10]  # blocks of 1, 2, 4, then the 3 left


# ---------------------------------------------------------------- copy-on-write


def test_fork_shares_pages_and_copies_on_the_first_write():
    manager = KVCacheManager("paged:block_size=4", 16, max_model_len=64)
    parent = Request(0, 6, 10)
    _admit(manager, parent)
    child = Request(1, 6, 10)
    child.num_computed_tokens = parent.num_computed_tokens
    manager.fork(parent, child)
    assert manager.block_table(child) == manager.block_table(parent)
    ops = manager.allocate(child, 1)  # writes into the shared, half-full second page
    assert ops is not None and len(ops.copies) == 1
    src, dst = ops.copies[0]
    assert src == manager.block_table(parent)[1]
    assert manager.block_table(child) == [manager.block_table(parent)[0], dst]
    assert manager.allocate(parent, 1).copies == []  # the parent owns its page alone again


# ---------------------------------------------------------------- swapping and preemption


def test_swap_out_then_in_restores_the_logical_table():
    manager = KVCacheManager("paged:block_size=4,preemption=swap", 8, max_model_len=64)
    seq = Request(0, 10, 4)
    _admit(manager, seq)
    before = manager.block_table(seq)[:3]
    out = manager.swap_out(seq)
    assert [src for src, _ in out.swap_outs] == before
    assert manager.usage().num_used_pages == 0
    back = manager.swap_in(seq)
    host_pages = [dst for _, dst in out.swap_outs]
    assert [src for src, _ in back.swap_ins] == host_pages
    assert [dst for _, dst in back.swap_ins] == manager.block_table(seq)[:3]


def _pressure(spec: str, num_pages: int = 6):
    manager = KVCacheManager(spec, num_pages, max_model_len=64)
    scheduler = Scheduler(SchedulerConfig(max_model_len=64, max_num_batched_tokens=64), manager)
    old, new = Request(0, 8, 16, arrival_s=0.0), Request(1, 8, 16, arrival_s=1.0)
    scheduler.add_request(old)
    scheduler.add_request(new)
    for step in range(40):
        output = scheduler.schedule(step)
        if output.preempted:
            return scheduler, output, old, new
        scheduler.update(output, None, step + 1)
    raise AssertionError("no preemption happened")


def test_recompute_preempts_the_last_arrived_and_requeues_it_first():
    scheduler, output, _old, new = _pressure("paged:block_size=4,watermark=0")
    assert output.preempted == [new]
    assert new.status is RequestStatus.WAITING and new.num_computed_tokens == 0
    assert scheduler.waiting[0] is new


def test_swap_falls_back_to_recompute_when_the_host_pool_is_full():
    _, _output, _, new = _pressure("paged:block_size=4,watermark=0,preemption=swap,host_pages=1")
    assert new.status is RequestStatus.WAITING and new.num_swaps_out == 0


def test_swap_preemption_uses_the_host_pool():
    scheduler, output, _, new = _pressure("paged:block_size=4,watermark=0,preemption=swap")
    assert new.status is RequestStatus.SWAPPED
    assert output.mem_ops.swap_outs and scheduler.swapped[0] is new


class _Costs:
    def __init__(self, swap_s: float) -> None:
        self.swap_s = swap_s

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        return self.swap_s

    def recompute_time_s(self, num_tokens: int) -> float:
        return 1.0


@pytest.mark.parametrize(("swap_s", "swaps"), [(0.1, True), (0.9, False)])
def test_auto_swaps_only_when_the_round_trip_beats_recomputation(swap_s, swaps):
    manager = KVCacheManager(
        "paged:block_size=4,preemption=auto", 8, max_model_len=64, costs=_Costs(swap_s)
    )
    seq = Request(0, 8, 4)
    _admit(manager, seq)
    assert manager.should_swap(seq) is swaps


def test_auto_without_a_cost_model_is_refused():
    with pytest.raises(KvlabError, match="cost model"):
        KVCacheManager("paged:preemption=auto", 8, max_model_len=64)


# ---------------------------------------------------------------- scheduler


def test_chunked_prefill_splits_a_prompt_over_the_token_budget():
    manager = KVCacheManager("paged:block_size=4", 32, max_model_len=64)
    scheduler = Scheduler(SchedulerConfig(max_model_len=64, max_num_batched_tokens=10), manager)
    seq = Request(0, 25, 2)
    scheduler.add_request(seq)
    chunks = []
    while seq.num_output_tokens == 0:
        output = scheduler.schedule(0)
        chunks.append(output.scheduled[0].num_new_tokens)
        scheduler.update(output, None, 1)
    assert chunks == [10, 10, 5]


@pytest.mark.parametrize(("reserve_full_isl", "admitted"), [(False, True), (True, False)])
def test_reserve_full_isl_admits_only_a_prompt_that_fits_whole(reserve_full_isl, admitted):
    manager = KVCacheManager("paged:block_size=4,watermark=0", 8, max_model_len=64)
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=16,
                             reserve_full_isl=reserve_full_isl)
    scheduler = Scheduler(config, manager)
    running, waiting = Request(0, 14, 10), Request(1, 20, 2)
    scheduler.add_request(running)
    scheduler.update(scheduler.schedule(0), None, 1)  # 4 of the 8 pages
    scheduler.add_request(waiting)
    output = scheduler.schedule(1)
    # a 15-token first chunk takes the 4 free pages; the whole prompt would take 5
    scheduled = {item.request.request_id: item.num_new_tokens for item in output.scheduled}
    assert scheduled == ({0: 1, 1: 15} if admitted else {0: 1})
    assert (waiting.status is RequestStatus.RUNNING) is admitted


def test_a_request_longer_than_max_model_len_fails_without_blocking_the_queue():
    manager = KVCacheManager("paged:block_size=4", 32, max_model_len=32)
    scheduler = Scheduler(SchedulerConfig(max_model_len=32, max_num_batched_tokens=64), manager)
    too_long, fine = Request(0, 30, 10), Request(1, 5, 2)
    scheduler.add_request(too_long)
    scheduler.add_request(fine)
    output = scheduler.schedule(0)
    assert output.failed == [too_long]
    assert too_long.status is RequestStatus.FINISHED_ERROR
    assert "max_model_len 32" in too_long.error
    assert [item.request for item in output.scheduled] == [fine]


def test_a_request_larger_than_the_whole_cache_fails():
    manager = KVCacheManager("paged:block_size=4", 4, max_model_len=64)
    scheduler = Scheduler(SchedulerConfig(max_model_len=64, max_num_batched_tokens=64), manager)
    seq = Request(0, 20, 2)
    scheduler.add_request(seq)
    assert scheduler.schedule(0).failed == [seq]
    assert "only 4" in seq.error


def test_swapped_requests_resume_before_waiting_ones_are_admitted():
    scheduler, _, _old, new = _pressure("paged:block_size=4,watermark=0,preemption=swap")
    late = Request(2, 4, 1, arrival_s=2.0)
    scheduler.add_request(late)
    step = 100
    while new.status is RequestStatus.SWAPPED:
        output = scheduler.schedule(step)
        if new.status is RequestStatus.SWAPPED:
            assert late.status is RequestStatus.WAITING
        scheduler.update(output, None, step + 1)
        step += 1
    assert late.first_scheduled_s is None or late.first_scheduled_s >= step - 1


def test_watermark_is_ignored_when_nothing_runs():
    manager = KVCacheManager("paged:block_size=4,watermark=0.5", 8, max_model_len=64)
    seq = Request(0, 30, 2)  # needs all 8 pages
    assert manager.can_allocate(seq, 30)
