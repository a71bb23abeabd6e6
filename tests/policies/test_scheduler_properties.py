"""Scheduler properties: limits are never exceeded and every request that fits alone finishes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies import (
    KVCacheManager,
    Request,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
)
from tests.policies.harness import ShadowCost, serve_steps
from tests.policies.test_manager_properties import COMBOS

MAX_MODEL_LEN = 128


@st.composite
def workloads(draw):
    spec = draw(st.sampled_from(COMBOS))
    block_size = draw(st.sampled_from([1, 4, 16]))
    # Memory for one or two maximal requests: constant pressure.
    num_pages = draw(st.integers(MAX_MODEL_LEN // block_size, 3 * MAX_MODEL_LEN // block_size))
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(1, 64))
    chunked = draw(st.booleans()) or budget < MAX_MODEL_LEN
    requests = []
    for request_id in range(draw(st.integers(1, 14))):
        prompt = draw(st.integers(1, 100))
        output = draw(st.integers(1, 60))  # some exceed max_model_len and must fail cleanly
        shared = draw(st.booleans())
        ids = [i % 5 for i in range(prompt)] if shared else None
        arrival = draw(st.integers(0, 30)) / 10
        requests.append(
            Request(request_id, prompt, output, arrival_s=arrival, prompt_token_ids=ids)
        )
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=chunked,
        reserve_full_isl=draw(st.booleans()),
    )
    spec = spec.replace(":", f":block_size={block_size},", 1)
    return spec, num_pages, config, requests


def run_workload(spec, num_pages, config, requests, max_steps=20_000, check_step=None,
                 groups=None, retention_interval=0):
    """Serve the requests to the end, checking the limits every step (and `check_step(output)`
    when given); returns the manager and the scheduler. `groups`: the manager's KV-cache
    groups (a hybrid manager)."""
    manager = KVCacheManager(
        spec, num_pages, max_model_len=config.max_model_len, costs=ShadowCost(),
        groups=groups, retention_interval=retention_interval,
    )
    scheduler = Scheduler(config, manager)

    def check_limits(output):
        if check_step is not None:
            check_step(output)
        assert output.num_batched_tokens <= config.max_num_batched_tokens
        assert len(output.scheduled) <= config.max_num_seqs
        assert len(scheduler.running) <= config.max_num_seqs
        assert sum(item.num_new_tokens for item in output.scheduled) == output.num_batched_tokens
        for item in output.scheduled:
            assert item.num_new_tokens >= 1
            tables = manager.block_tables(item.request) if groups else \
                [manager.block_table(item.request)]
            for table, group in zip(tables, groups or [None], strict=True):
                if group is None or group.kind != "state" or manager.caching:
                    assert len(table) * manager.page_size >= (
                        item.num_computed_tokens + item.num_new_tokens
                    )

    serve_steps(scheduler, requests, check_limits, max_steps)
    return manager, scheduler


@given(workload=workloads())
def test_limits_hold_and_every_request_that_fits_alone_finishes(workload):
    spec, num_pages, config, requests = workload
    manager, _ = run_workload(spec, num_pages, config, requests)
    for request in requests:
        fits = (
            request.total_len <= config.max_model_len
            and manager.pages_needed_alone(request) <= num_pages
        )
        if fits:
            assert request.status is RequestStatus.FINISHED_LENGTH
            assert request.num_output_tokens == request.max_output_tokens
        else:
            assert request.status is RequestStatus.FINISHED_ERROR
            assert request.error
    usage = manager.usage()
    assert usage.num_used_pages == 0
    assert usage.num_host_used_pages == 0


@given(workload=workloads())
def test_same_workload_same_schedule(workload):
    spec, num_pages, config, requests = workload

    def trace():
        fresh = [
            Request(
                r.request_id,
                r.prompt_len,
                r.max_output_tokens,
                arrival_s=r.arrival_s,
                prompt_token_ids=r.prompt_token_ids,
            )
            for r in requests
        ]
        _manager, scheduler = run_workload(spec, num_pages, config, fresh)
        return [(r.first_token_s, r.finish_s, r.num_preemptions) for r in fresh], list(
            scheduler.itls_s
        )

    assert trace() == trace()
