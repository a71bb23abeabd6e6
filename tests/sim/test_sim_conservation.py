"""Conservation: every arrived request completes or fails with a reason; no memory is left held."""

from hypothesis import given, settings
from hypothesis import strategies as st
from sim_workloads import make_trace, small_config

from kvlab.metrics import COMPLETED_STATUSES
from kvlab.policies import RequestStatus
from kvlab.sim import Simulation

POLICIES = (
    "paged",
    "paged:preemption=swap",
    "paged:preemption=auto",
    "paged:preemption=swap,host_pages=4",
    "paged:eviction=lru",
    "paged:block_size=64,victim=longest",
    "paged:block_sizing=geometric",
    "buddy",
    "contiguous:reserve=max",
    "contiguous:reserve=pow2",
    "contiguous:reserve=oracle",
)

lengths = st.lists(st.tuples(st.integers(1, 400), st.integers(1, 80)), min_size=1, max_size=20)


def _run(trace, policy, num_pages, **options):
    simulation = Simulation(trace, small_config(policy, num_pages=num_pages, **options))
    return simulation, simulation.run()


@settings(max_examples=60, deadline=None)
@given(
    lengths=lengths,
    gaps=st.lists(st.floats(0.0, 0.2), min_size=20, max_size=20),
    policy=st.sampled_from(POLICIES),
    num_pages=st.integers(4, 48),
    shared_prefix=st.booleans(),
)
def test_every_request_ends_and_every_page_comes_back(
    lengths, gaps, policy, num_pages, shared_prefix
):
    arrivals = [sum(gaps[: i + 1]) for i in range(len(lengths))]
    # Half the examples share their first 32 prompt tokens, for the prefix cache.
    hash_ids = [(1, 2, *range(100 * i + 3, 100 * i + 33)) for i in range(len(lengths))]
    trace = make_trace(lengths, arrivals, hash_ids=hash_ids if shared_prefix else None)
    simulation, result = _run(trace, policy, num_pages, max_num_batched_tokens=256)

    for request in result.requests:
        if request.status.value in COMPLETED_STATUSES:
            assert request.num_output_tokens == request.max_output_tokens
            assert request.arrival_s <= request.first_token_s <= request.finish_s
        else:
            assert request.status is RequestStatus.FINISHED_ERROR
            assert request.error and request.num_output_tokens == 0
    usage = simulation.manager.usage()
    assert usage.num_used_pages == 0 and usage.num_host_used_pages == 0
    assert usage.num_live_token_slots == 0
    assert not simulation.scheduler.has_unfinished()


def test_a_request_longer_than_the_model_fails_with_a_reason_and_others_complete():
    trace = make_trace([(100, 10), (5000, 10), (50, 5)])
    _, result = _run(trace, "paged", 512)
    statuses = [r.status for r in result.requests]
    assert statuses[1] is RequestStatus.FINISHED_ERROR
    assert "max_model_len 4096" in result.requests[1].error
    assert {statuses[0].value, statuses[2].value} <= COMPLETED_STATUSES


def test_a_request_larger_than_the_whole_cache_fails_with_a_reason():
    trace = make_trace([(600, 10)])
    _, result = _run(trace, "paged", 8)  # 8 pages of 16 tokens
    assert result.requests[0].status is RequestStatus.FINISHED_ERROR
    assert "only 8" in result.requests[0].error


def test_every_computed_token_is_recorded_in_the_steps():
    trace = make_trace([(100, 20), (300, 7), (17, 1)], [0.0, 0.01, 0.5])
    _, result = _run(trace, "paged", 64)
    columns = result.steps.columns
    num_batched = sum(columns["num_prefill_tokens"]) + sum(columns["num_decode_tokens"])
    # without preemptions each prompt is prefilled once and each later token decoded once
    assert sum(columns["num_preempted"]) == 0
    assert num_batched == sum(r.prompt_len + r.max_output_tokens - 1 for r in result.requests)
