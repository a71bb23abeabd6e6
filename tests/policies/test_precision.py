"""Precision policies (policies/precision/): the spec grammar, the ladder, and, under random
workloads, pages and bytes conserved and no demoted page read at its old precision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.policies import KVCacheManager, Request, Scheduler, SchedulerConfig
from kvlab.policies.outputs import MemOps
from kvlab.policies.precision.ladder import build_ladder
from kvlab.policies.precision.ledger import PrecisionLedger
from kvlab.policies.spec import parse_policy
from tests.policies.harness import ShadowCost, serve_steps

MAX_MODEL_LEN = 128
LADDER = build_ladder("auto", 2, head_dim=128, model_dtype_bytes=2)


def test_precision_none_is_left_out_of_the_spec_and_its_json():
    spec = parse_policy("paged:eviction=lru")
    assert spec.precision == "none"
    assert "precision" not in spec.to_json() and "precision" not in str(spec)


def test_precision_parameters_follow_the_name_in_a_policy_spec():
    spec = parse_policy("paged:precision=age:recent=64,depth=2,eviction=lru")
    assert spec.precision == "age:recent=64,depth=2"
    assert spec.eviction == "lru"
    assert parse_policy(str(spec)) == spec


@pytest.mark.parametrize("text", ["paged:precision=age:recnt=4", "paged:precision=fp4",
                                  "paged:precision=age:depth=0"])
def test_a_bad_precision_names_what_is_wrong(text):
    with pytest.raises(KvlabError, match=r"precision|age"):
        parse_policy(text)


def test_the_ladder_steps_bf16_to_fp8_to_int4_with_scales():
    assert LADDER.names == ("auto", "fp8_e4m3", "int4_per_token_head")
    assert LADDER.row_bytes == (256, 128, 68)


def test_a_ladder_deeper_than_its_dtypes_names_the_flag():
    with pytest.raises(KvlabError, match="depth=1"):
        build_ladder("int4_per_token_head", 1, 128, 2)
    with pytest.raises(KvlabError) as error:
        build_ladder("fp8", 2, 128, 2)
    assert error.value.parameters == ("kv_cache_dtype",)


def test_a_manager_without_a_ladder_refuses_demotion():
    with pytest.raises(KvlabError, match="precision ladder"):
        KVCacheManager("paged:precision=age", 8, max_model_len=MAX_MODEL_LEN)


def test_age_demotion_keeps_the_recent_tokens_and_frees_their_bytes():
    manager = KVCacheManager("paged:block_size=4,precision=age:recent=8", 8,
                             max_model_len=MAX_MODEL_LEN, precision_ladder=LADDER)
    request = Request(0, 24, 1)
    manager.begin_step()
    assert manager.allocate(request, 24) is not None
    manager.end_step(_ops())
    request.num_computed_tokens = 24
    manager.begin_step()  # 24 tokens: pages 0..3 end at or before token 16 = 24 - 8
    ops = _ops()
    manager.end_step(ops)
    assert ops.requantize == [(page, 0, 1) for page in manager.block_table(request)[:4]]
    assert manager.precision is not None
    # 4 pages at half their bytes pay for 2 more pages
    assert manager.precision.ledger.num_extra - manager.precision.ledger.num_ballast_pages == 2


def test_a_request_admitted_again_reads_its_new_pages_whole():
    """With `pressure`, steps without pressure walk no sequence: the entry a request had
    before it was preempted must not count for the new pages it is admitted with."""
    manager = KVCacheManager("paged:block_size=4,precision=age:recent=8,pressure=0.5", 8,
                             max_model_len=MAX_MODEL_LEN, precision_ladder=LADDER)
    driver, request = manager.precision, Request(0, 24, 1)
    assert driver is not None
    manager.begin_step()
    assert manager.allocate(request, 24) is not None
    manager.end_step(_ops())
    request.num_computed_tokens = 24
    manager.begin_step()  # 2 of 8 pages free: under pressure, pages 0..3 demoted
    manager.end_step(_ops())
    assert driver.num_saved_context_tokens([request]) == 8.0  # 4 pages at half their bytes
    manager.begin_step()
    manager.free(request)  # (preempted)
    manager.end_step(_ops())
    request.num_computed_tokens = 0
    manager.begin_step()  # every page free or cached: no pressure, no walk
    assert manager.allocate(request, 24) is not None
    assert [driver.ledger.level(page) for page in manager.block_table(request)] == [0] * 6
    assert driver.num_saved_context_tokens([request]) == 0.0
    manager.end_step(_ops())


def _ops() -> MemOps:
    return MemOps()


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    num_pages = draw(st.integers(MAX_MODEL_LEN // block_size, 3 * MAX_MODEL_LEN // block_size))
    eviction = draw(st.sampled_from(["none", "lru", "fifo", "lfu"]))
    recent = draw(st.sampled_from([1, 8, 32]))
    depth = draw(st.integers(1, 2))
    pressure = draw(st.sampled_from([0.0, 0.5]))
    recompute = draw(st.integers(0, 1)) if eviction != "none" else 0
    cached = 0 if recompute else draw(st.integers(0, 1))
    preemption = draw(st.sampled_from(["recompute", "swap"]))
    spec = (f"paged:block_size={block_size},eviction={eviction},preemption={preemption},"
            f"precision=age:recent={recent},depth={depth},pressure={pressure},"
            f"cached={cached},recompute={recompute}")
    requests = []
    for request_id in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, 100))
        output = draw(st.integers(1, 27))
        ids = [i % 5 for i in range(prompt)] if draw(st.booleans()) else None
        requests.append(Request(request_id, prompt, output,
                                arrival_s=draw(st.integers(0, 30)) / 10, prompt_token_ids=ids))
    config = SchedulerConfig(max_num_seqs=draw(st.integers(1, 8)),
                             max_num_batched_tokens=draw(st.integers(16, 64)),
                             max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True)
    return spec, num_pages, config, requests


def check_memory(manager: KVCacheManager, shadow: dict[int, int]) -> None:
    """Every page id in exactly one place, the bytes within the device's, and every held or
    cached page at the level the executed requantizations left it."""
    precision = manager.precision
    assert precision is not None
    ledger, pool = precision.ledger, manager.pool
    free = list(pool.allocator.free_list)
    cached = list(pool.evictor.pages())
    held = {page for state in manager._seqs.values() for page in state.pages}
    places = free + cached + list(held) + ledger.ballast
    assert len(places) == len(set(places)), "a page in two places"
    num_ids = manager.num_total_pages + ledger.num_extra
    assert set(places) == set(range(num_ids)), "a page lost"
    # bytes: held and cached pages at their levels, free pages at the cache's dtype
    row = ledger.ladder.row_bytes
    used = sum(row[ledger.level(page)] for page in list(held) + cached) + row[0] * len(free)
    assert ledger.max_debt_pages or used <= row[0] * manager.num_total_pages
    # the held pages' spared bytes, in whole pages: what KV usage takes off the pages held
    spared = sum(row[0] - row[ledger.level(page)] for page in held) // row[0]
    assert ledger.num_spared_pages == spared
    assert ledger.max_debt_pages or len(held) - spared <= manager.num_total_pages
    for page in list(held) + cached:
        assert shadow.get(page, 0) == ledger.level(page), f"page {page} read at a wrong level"


class _Told:
    """The ledger, with the pool's word that pages lost their content passed to the shadow
    first (a page reused is written whole, at the cache's dtype)."""

    def __init__(self, ledger: PrecisionLedger, shadow: dict[int, int]) -> None:
        self.ledger, self.shadow = ledger, shadow

    def __getattr__(self, name: str) -> object:
        return getattr(self.ledger, name)

    def drop(self, pages: list[int], reuse: bool) -> list[int]:
        for page in pages:
            self.shadow.pop(page, None)
        return self.ledger.drop(pages, reuse)


def test_a_request_needing_most_pages_fits_beside_cached_demoted_pages():
    """The thorough profile's livelock: 2 cached int4 pages (0.53 pages of bytes) and a lone
    request of 7 of the 8 device pages; counting the cached pages a page short more than
    evicting them frees, the pool never fit its last chunk and preempted it for ever."""
    spec = ("paged:block_size=16,eviction=lru,preemption=recompute,precision=age:recent=1,"
            "depth=2,pressure=0.5,cached=0,recompute=0")
    config = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=33,
                             max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True)
    requests = [Request(0, 97, 1, arrival_s=0.1),
                Request(1, 40, 27, prompt_token_ids=[i % 5 for i in range(40)])]
    requests += [Request(i, 1, 1) for i in range(2, 7)]
    steps, manager = run_checked((spec, 8, config, requests))
    assert steps < 60
    assert sum(r.num_preemptions for r in requests) == 0
    assert manager.precision is not None and manager.precision.ledger.max_debt_pages == 0


@given(workload=workloads())
def test_demotion_conserves_pages_and_bytes_and_levels(workload):
    run_checked(workload)


def run_checked(workload) -> tuple[int, KVCacheManager]:
    """Runs `workload` to the end, checking memory and levels every step; (steps, manager)."""
    spec, num_pages, config, requests = workload
    manager = KVCacheManager(spec, num_pages, max_model_len=MAX_MODEL_LEN, costs=ShadowCost(),
                             precision_ladder=LADDER)
    scheduler = Scheduler(config, manager)
    shadow: dict[int, int] = {}  # what the executor's requantizations left in each page
    manager.pool.ledger = _Told(manager.precision.ledger, shadow)

    def check(output):
        requantize = output.mem_ops.requantize
        for page, before, after in requantize:
            assert shadow.get(page, 0) == before, "requantized from a level it is not at"
            shadow[page] = after
        check_memory(manager, shadow)
        # what the step's requantizations cost, from the driver's counts, is each one's sum
        ratios = manager.precision.requantize_ratios
        assert manager.precision.requantized_pages(requantize) == sum(
            ratios[before, after] for _, before, after in requantize) / 2

    steps = serve_steps(scheduler, requests, check)
    assert manager.usage().num_used_pages == 0
    assert manager.precision.ledger.max_debt_pages <= 2
    return steps, manager
