"""The scheduler and the manager under every policy combination, executed on a shadow of device
and host memory (`ShadowExecutor`): every step's MemOps and writes, checked after every step;
and every request that fits in memory alone runs to its end."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.policies import (
    ArrivalQueue,
    KVCacheManager,
    Request,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
)
from tests.policies.harness import ShadowCost
from tests.policies.shadow import ShadowExecutor
from tests.policies.test_manager_properties import COMBOS

MAX_MODEL_LEN = 96


def _request(rng: random.Random, request_id: int) -> Request:
    """Token ids from a few families that share prefixes (outputs use the same few ids), trace
    block ids along the paths of a trie, or no content."""
    prompt_len = rng.randint(1, 64)
    output = rng.randint(1, 40)
    arrival = rng.randint(0, 20) / 10
    content = rng.choice(["ids", "ids", "ids", "hash_ids", "unknown"])
    if content == "hash_ids":
        block = rng.choice([2, 4, 8])
        branch = [rng.randint(0, 1) for _ in range(8)]
        # block i's id names the whole prefix up to it, as in Mooncake traces (and ids of
        # different block sizes never meet, as in any one trace)
        ids = tuple(
            hash((block, *branch[: i + 1])) & 0xFFFFFFFFFF for i in range(-(-prompt_len // block))
        )
        return Request(request_id, prompt_len, output, arrival_s=arrival, hash_ids=ids[:8],
                       hash_block_size=block)
    if content == "unknown":
        return Request(request_id, prompt_len, output, arrival_s=arrival)
    family = rng.randrange(3)
    tokens = [(family * (i // 5) + i) % 3 for i in range(prompt_len)]
    return Request(request_id, prompt_len, output, arrival_s=arrival, prompt_token_ids=tokens,
                   output_ids_known=rng.random() < 0.5)


@st.composite
def shadow_workloads(draw):
    spec = draw(st.sampled_from(COMBOS))
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    host_pages = draw(st.sampled_from([0, 4, 64]))
    budget = draw(st.integers(1, 48))
    config = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=draw(st.booleans()) or budget < MAX_MODEL_LEN,
        reserve_full_isl=draw(st.booleans()),
    )
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    requests = [_request(rng, request_id) for request_id in range(rng.randint(1, 24))]
    longest = max(-(-r.total_len // block_size) for r in requests)
    if draw(st.booleans()):  # just room for the longest request: it runs alone, at the edge
        num_pages = longest + draw(st.integers(0, 2))
    else:
        num_pages = draw(st.integers(max(1, longest // 2), 3 * MAX_MODEL_LEN // block_size))
    spec = spec.replace(":", f":block_size={block_size},host_pages={host_pages},", 1)
    return spec, num_pages, config, requests


def _serve(spec: str, num_pages: int, config: SchedulerConfig, requests: list[Request]):
    manager = KVCacheManager(spec, num_pages, max_model_len=MAX_MODEL_LEN, costs=ShadowCost())
    return serve_on_shadow(manager, config, requests)


def serve_on_shadow(manager: KVCacheManager, config: SchedulerConfig, requests: list[Request],
                    after_step=None) -> KVCacheManager:
    """Serve the requests to the end on a shadow executor (calling `after_step()` after each
    step); returns the manager."""
    scheduler = Scheduler(config, manager)
    executor = ShadowExecutor(scheduler)
    arrivals = ArrivalQueue(requests)
    now = 0.0
    for _ in range(20_000):
        arrivals.admit_until(now, scheduler)
        if not scheduler.has_unfinished():
            if not len(arrivals):
                return manager
            now = arrivals.next_arrival_s()
            continue
        executor.step(now)
        if after_step is not None:
            after_step()
        now += 0.05
    raise AssertionError("livelock: the workload did not finish in 20,000 steps")


# Five times the profile's examples: each is quick, and the rarest paths (a request preempted
# in the step that allocated it) come up in about one workload of a hundred.
@settings(max_examples=5 * settings.default.max_examples)
@given(workload=shadow_workloads())
def test_every_step_keeps_each_sequence_in_its_own_pages(workload):
    spec, num_pages, config, requests = workload
    manager = _serve(spec, num_pages, config, requests)
    for request in requests:
        fits = manager.pages_needed_alone(request) <= num_pages
        if request.total_len <= MAX_MODEL_LEN and fits:
            assert request.status is RequestStatus.FINISHED_LENGTH, request.error
            assert request.num_output_tokens == request.max_output_tokens
        else:
            assert request.status is RequestStatus.FINISHED_ERROR
    usage = manager.usage()
    assert usage.num_used_pages == 0 and usage.num_host_used_pages == 0
