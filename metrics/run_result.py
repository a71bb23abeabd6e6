"""The record of a finished run, simulated or real: `RunResult`, and runs combined as one
(`merge_runs`, `combine_runs`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvlab.metrics.precision_mix import steps_mix_summary
from kvlab.metrics.records import StepRecorder

# A request is completed when it produced its output normally; every other one counts as failed
# (finished_error: could never run; finished_aborted: cut off; a non-terminal status: the run
# ended first), as vLLM counts every unsuccessful request as failed. By status value: the names
# the request tables save.
COMPLETED_STATUSES = frozenset({"finished_stopped", "finished_length"})


class Status(Protocol):
    """A request's status: its `value` is the name the tables save (e.g. "finished_length")."""

    @property
    def value(self) -> str:
        """The status name."""
        ...


class RequestRecord(Protocol):
    """What a run's record reads of each request (the scheduler's `Request` is one)."""

    request_id: int
    arrival_s: float
    prompt_len: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    num_swaps_out: int
    first_scheduled_s: float | None
    first_token_s: float | None
    finish_s: float | None
    error: str | None

    @property
    def status(self) -> Status:
        """Where the request ended."""
        ...


@dataclass(slots=True)
class RunResult:
    """Everything a finished run (simulated or real) leaves behind, on one clock in seconds.

    `requests` are all arrived requests with terminal status; `itls_s` holds every gap between
    consecutive output tokens of the completed requests, concatenated (the producer collects
    them, since a request keeps no per-token stamps). `duration_s` runs from the first arrival to
    the last finish. `metadata` holds the run's description: policy (spec string), policy_json,
    model, hardware, dataset, seed, backend ("sim" or "engine:<device>"), num_prompts,
    request_rate and whatever else the producer wants saved with the summary.
    """

    requests: Sequence[Any]  # RequestRecord each (Any: a list of Request is accepted as is)
    steps: StepRecorder
    itls_s: np.ndarray
    duration_s: float
    page_size: int
    num_total_pages: int
    kv_cache_size_tokens: int
    num_host_pages: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)


def merge_runs(results: Sequence[RunResult]) -> RunResult:
    """Several runs as one: their requests, steps and inter-token gaps together, durations
    added (each run's clock starts anew; nothing is counted between them). Summarizing the
    merge pools the runs' requests: a mean is over every request, a throughput is all tokens
    over all the time served. The runs must share their memory shape and have distinct
    request ids."""
    if not results:
        raise ValueError("merge_runs needs at least one run")
    first = results[0]
    if len(results) == 1:
        return first
    requests = [request for result in results for request in result.requests]
    # (a precision policy's mix over every run's steps, not the first run's: `combine_runs`)
    kept = {key: value for key, value in first.metadata.items()
            if not key.startswith("precision_")}
    return combine_runs(results, requests, sum(result.duration_s for result in results),
                        {**kept, "num_prompts": len(requests)})


def combine_runs(runs: Sequence[RunResult], requests: Sequence[Any], duration_s: float,
                 metadata: dict[str, Any]) -> RunResult:
    """`runs` (one memory shape, else ValueError) as one run of `requests` lasting
    `duration_s`: their steps run by run, their inter-token gaps together, `metadata` with
    the precision mix over all their steps (none where a run had none). `merge_runs` (runs
    one after another) and a simulated cluster's whole view (runs side by side) are both
    this."""
    first = runs[0]
    shape = (first.page_size, first.num_total_pages, first.num_host_pages)
    if any((run.page_size, run.num_total_pages, run.num_host_pages) != shape for run in runs):
        raise ValueError("the runs' KV memory differs (page size or page counts): they cannot "
                         "be one run")
    steps = StepRecorder()
    for run in runs:
        steps.extend(run.steps)
    mix = steps_mix_summary(steps, [run.metadata for run in runs], duration_s)
    return dataclasses.replace(
        first,
        requests=requests,
        steps=steps,
        itls_s=np.concatenate([run.itls_s for run in runs]),
        duration_s=duration_s,
        metadata={**metadata, **mix},
    )
