"""The step count the calibrated cost model prices padded decode attention with: decodes times
the longest decode context, kept right as the batch is built and as preemptions unschedule."""

from __future__ import annotations

from hypothesis import given

from tests.policies.test_scheduler_properties import run_workload, workloads


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
    def check(output) -> None:
        contexts = decode_contexts(output)
        assert len(contexts) == output.num_decode_tokens
        assert output.num_padded_context_tokens == len(contexts) * max(contexts, default=0)

    run_workload(*case, check_step=check)
