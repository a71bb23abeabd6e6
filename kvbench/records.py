"""What a benchmark client sees of one request: when it sent it, when each streamed chunk of
tokens arrived, how it ended. A `BenchRequest` is a `kvlab.metrics.RequestRecord`, so a client
run summarizes exactly as a simulated or an engine run does."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from kvlab.policies import RequestStatus

# A server's finish_reason -> the status a finished request's record carries.
FINISH_STATUSES = {"length": RequestStatus.FINISHED_LENGTH, "stop": RequestStatus.FINISHED_STOPPED}


@dataclass(slots=True)
class BenchRequest:
    """One request of a benchmark run, on the run's clock (seconds since the benchmark began).

    `arrival_s` is when it was sent (after any wait for --max-concurrency), as vLLM's client
    measures TTFT from the send. `chunk_times_s[i]` is when the i-th streamed chunk holding
    tokens arrived and `chunk_tokens[i]` how many tokens it held. A client cannot see
    preemptions or swaps: those counters stay 0 here (the server's /metrics counts them).
    `num_cached_tokens` is the server's `usage.prompt_tokens_details.cached_tokens` when it
    reports one. `prompt_token_ids` are the prompt's ids as the server returned them (vLLM and
    kvlab serve do with `return_token_ids`), for a text prompt the server tokenized, whose
    `prompt_len` is then the server's count. `status` is set when the request ends.
    `priority` (sent as the API's `priority` field) and `slo_class` are the trace's, so that
    the run's summary has per-class metrics as a simulated one does.
    """

    request_id: int
    prompt_len: int
    max_tokens: int
    scheduled_s: float  # when the workload wanted it sent
    arrival_s: float = float("nan")
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finish_s: float | None = None
    error: str | None = None
    status: RequestStatus = RequestStatus.WAITING
    generated_text: str = ""
    output_token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    num_preemptions: int = 0
    num_swaps_out: int = 0
    priority: int = 0
    slo_class: str | None = None

    @property
    def first_token_s(self) -> float | None:
        """When the first chunk of tokens arrived."""
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def first_scheduled_s(self) -> float | None:
        """The send time of a request that reached the server (a client cannot see when the
        server scheduled it); the prefix hit rate counts the prompts of these."""
        return None if self.arrival_s != self.arrival_s else self.arrival_s

    @property
    def completed(self) -> bool:
        """It produced its output normally."""
        return self.status in FINISH_STATUSES.values()

    @property
    def ttft_s(self) -> float | None:
        """First token minus send, or None without one."""
        first = self.first_token_s
        return None if first is None else first - self.arrival_s

    @property
    def latency_s(self) -> float | None:
        """Finish minus send (vLLM's `latencies`), or None when it never finished."""
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    def itls_s(self) -> list[float]:
        """Gaps between consecutive chunks, as vLLM's client records `itl` (one per chunk)."""
        times = self.chunk_times_s
        return [later - earlier for earlier, later in itertools.pairwise(times)]
