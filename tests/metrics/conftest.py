"""Builders of hand-made requests, step records and run results for the metrics tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from kvlab.metrics import INT_COLUMNS, RunResult, StepCounts, StepRecorder
from kvlab.policies.outputs import count_runs
from kvlab.policies.request import Request, RequestStatus

PAGE_SIZE = 16
NUM_TOTAL_PAGES = 100


def build_request(
    request_id: int,
    *,
    arrival_s: float = 0.0,
    first_token_s: float | None = 1.0,
    finish_s: float | None = 2.0,
    prompt_len: int = 10,
    output_len: int = 5,
    status: RequestStatus = RequestStatus.FINISHED_LENGTH,
    **counters: int,
) -> Request:
    """A finished request with the given stamps; scheduled at arrival unless it failed."""
    request = Request(
        request_id=request_id,
        prompt_len=prompt_len,
        max_output_tokens=output_len,
        arrival_s=arrival_s,
        status=status,
        num_output_tokens=output_len,
        first_token_s=first_token_s,
        last_token_s=finish_s,
        finish_s=finish_s,
    )
    if status is not RequestStatus.FINISHED_ERROR:
        request.first_scheduled_s = arrival_s
    for name, value in counters.items():
        setattr(request, name, value)
    return request


def build_failed_request(
    request_id: int, *, prompt_len: int = 10, arrival_s: float = 0.0
) -> Request:
    """A request that finished with an error without ever running."""
    request = build_request(
        request_id,
        arrival_s=arrival_s,
        first_token_s=None,
        finish_s=None,
        prompt_len=prompt_len,
        output_len=0,
        status=RequestStatus.FINISHED_ERROR,
    )
    request.error = f"prompt of {prompt_len} tokens does not fit"
    return request


def add_step(
    steps: StepRecorder,
    *,
    duration_s: float = 1.0,
    used: int = 0,
    live: int = 0,
    internal: int = 0,
    external: int = 0,
    swap_outs: Sequence[tuple[int, int]] = (),
    swap_ins: Sequence[tuple[int, int]] = (),
) -> None:
    """Append one step with the given memory state (every other column 0)."""
    start_s = float(sum(steps.columns["duration_s"]))
    row = dict.fromkeys(INT_COLUMNS, 0)
    row.update(
        step_id=len(steps),
        num_swap_out_pages=len(swap_outs),
        num_swap_in_pages=len(swap_ins),
        num_swap_out_transfers=count_runs(list(swap_outs)),
        num_swap_in_transfers=count_runs(list(swap_ins)),
        num_used_pages=used,
        num_free_pages=NUM_TOTAL_PAGES - used,
        num_live_token_slots=live,
        num_internal_frag_slots=internal,
        num_external_frag_pages=external,
    )
    steps.append(start_s, duration_s, duration_s,
                 StepCounts._make(row[name] for name in INT_COLUMNS))


def build_result(
    requests: Sequence[Request] = (),
    *,
    steps: StepRecorder | None = None,
    itls_s: Sequence[float] = (),
    duration_s: float = 10.0,
    metadata: dict | None = None,
) -> RunResult:
    """A RunResult over the given requests and steps, on a 100-page pool of 16-token pages."""
    return RunResult(
        requests=list(requests),
        steps=steps if steps is not None else StepRecorder(),
        itls_s=np.asarray(itls_s, dtype=np.float64),
        duration_s=duration_s,
        page_size=PAGE_SIZE,
        num_total_pages=NUM_TOTAL_PAGES,
        kv_cache_size_tokens=PAGE_SIZE * NUM_TOTAL_PAGES,
        num_host_pages=0,
        metadata=dict(metadata or {}),
    )


@pytest.fixture(scope="session")
def make_request() -> Callable[..., Request]:
    """Factory of hand-made finished requests."""
    return build_request


@pytest.fixture(scope="session")
def make_failed() -> Callable[..., Request]:
    """Factory of requests that failed without running."""
    return build_failed_request


@pytest.fixture(scope="session")
def make_result() -> Callable[..., RunResult]:
    """Factory of RunResults."""
    return build_result


@pytest.fixture(scope="session")
def record_step() -> Callable[..., None]:
    """Appends one hand-made step to a StepRecorder."""
    return add_step
