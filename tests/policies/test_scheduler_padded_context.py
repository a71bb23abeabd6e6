"""The step count the calibrated cost model prices padded decode attention with: decodes times
the longest decode context, kept right as the batch is built and as preemptions unschedule."""

from __future__ import annotations

from hypothesis import given

from kvlab.policies import ArrivalQueue, KVCacheManager, Scheduler
from tests.policies.harness import ShadowCost
from tests.policies.test_scheduler_properties import workloads


def decode_contexts(output) -> list[int]:
    """Context of every decode in the batch, its new token included (before the update)."""
    return [
        done + 1
        for request, new, done in zip(
            output.requests, output.num_new_tokens, output.num_computed_tokens, strict=True
        )
        if new == 1 and 0 < done == request.num_tokens - 1
    ]


@given(workloads())
def test_padded_context_is_the_decodes_times_the_longest_decode_context(case):
    spec, num_pages, config, requests = case
    manager = KVCacheManager(
        spec, num_pages, max_model_len=config.max_model_len, costs=ShadowCost()
    )
    scheduler = Scheduler(config, manager)
    arrivals = ArrivalQueue(requests)
    now = 0.0
    while len(arrivals) or scheduler.has_unfinished():
        arrivals.admit_until(now, scheduler)
        if not scheduler.has_unfinished():
            now = arrivals.next_arrival_s()
            continue
        output = scheduler.schedule(now)
        contexts = decode_contexts(output)
        assert len(contexts) == output.num_decode_tokens
        assert output.num_padded_context_tokens == len(contexts) * max(contexts, default=0)
        now += 0.01
        scheduler.update(output, None, now)
