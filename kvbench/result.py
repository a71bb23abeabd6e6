"""A finished benchmark, `BenchResult`: the client's `RunResult` (so that
`kvlab.metrics.summarize` computes every latency exactly as it does for the simulator and the
engine), the server's configuration and the scraped metrics, with its summary in
`vllm bench serve`'s keys plus the KV section the server's `/metrics` gives, its
`--save-detailed` arrays and kvlab's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvlab.bench.host_cpu import ticks_between
from kvlab.bench.kv_event_stream import KVEventStream
from kvlab.bench.observed import ServerInfo, kv_summary, server_latency_summary
from kvlab.bench.records import BenchRequest
from kvlab.metrics import RunResult, per_request_table, summarize
from kvlab.metrics.precision_mix import DEMOTIONS_KEY

if TYPE_CHECKING:
    import pandas as pd

RESULT_FORMAT = "kvlab-bench-serve"
# vLLM's per-request arrays, kept only with --save-detailed (vLLM drops them otherwise).
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                 "generated_texts", "errors")
# The KV keys a client cannot observe: absent from a bench summary, not zero.
UNOBSERVED_KEYS = ("kv_token_state_perc", "internal_fragmentation_perc",
                   "external_fragmentation_perc", "num_swaps_in", "num_swap_out_pages",
                   "num_swap_in_pages", "num_host_pages")


@dataclass(slots=True)
class BenchResult:
    """A finished benchmark: the client's run as a RunResult (requests are BenchRequests,
    no steps), the server's configuration, the scraped metrics' time series
    (`observed.metrics_series`; `started_at` is the run's start, epoch seconds) and the
    workload's request layout (`hash_ids` per request where the trace shares prompt blocks).
    With a KV event subscription, `kv_events` holds the server's event stream and
    `prompt_token_ids` every request's prompt (what KV lockstep replays). `host_cpu` holds the
    client host's cumulative CPU times at each scrape (`time_s` since `started_at`,
    `steal_ticks`, `total_ticks`; empty where the host does not tell): how much of the
    machine the hypervisor withheld during the run (`kvlab.bench.host_cpu`)."""

    run: RunResult
    server: ServerInfo
    series: dict[str, list[float]]
    started_at: float
    metrics_errors: list[str] = field(default_factory=list)
    hash_ids: list[list[int] | None] = field(default_factory=list)
    hash_block_size: int = 512
    kv_events: KVEventStream | None = None
    prompt_token_ids: list[list[int]] | None = None
    host_cpu: dict[str, list[float]] = field(default_factory=dict)

    @property
    def requests(self) -> list[BenchRequest]:
        """The requests' records, in request-id order."""
        return list(self.run.requests)

    def summary(self, **options: Any) -> dict[str, Any]:
        """vLLM's result keys: `summarize`'s metrics over the client's records, the peaks
        vLLM's client reports, and the KV section from the server's metrics (None where it
        exports nothing). `options` are summarize's (percentiles, goodput)."""
        summary = summarize(self.run, **options)
        for key in UNOBSERVED_KEYS:
            summary.pop(key, None)
        summary.update(kv_summary(self.series, self.server))
        demoted = [v for k, v in summary.items() if DEMOTIONS_KEY.fullmatch(k)]
        if demoted:  # (as the simulator's: over the run's duration)
            duration = self.run.duration_s
            summary["precision_demotions_per_s"] = sum(demoted) / duration if duration else 0.0
        summary.update(server_latency_summary(self.series))
        summary["host_cpu_steal_perc"] = self.host_cpu_steal_perc()
        if "request_goodput" not in summary:
            summary["request_goodput"] = None
        summary.update(peaks(self.requests))
        return summary

    def host_cpu_steal_perc(self, start_s: float = -math.inf,
                            end_s: float = math.inf) -> float | None:
        """The share of the client host's CPU time that the hypervisor withheld (steal)
        between the first and last samples within [start_s, end_s] (seconds since
        `started_at`), in percent; None where the host does not tell."""
        ticks = self.host_cpu_ticks(start_s, end_s)
        return None if ticks is None else 100.0 * ticks[0] / ticks[1]

    def host_cpu_ticks(self, start_s: float = -math.inf,
                       end_s: float = math.inf) -> tuple[float, float] | None:
        """(steal, total) ticks of the client host's CPU between the first and last samples
        within [start_s, end_s] (`host_cpu.ticks_between`); None where the host does not
        tell."""
        cpu = self.host_cpu
        inside = [i for i, t in enumerate(cpu.get("time_s", ())) if start_s <= t <= end_s]
        return ticks_between([cpu["steal_ticks"][i] for i in inside],
                             [cpu["total_ticks"][i] for i in inside])

    def requests_table(self) -> pd.DataFrame:
        """One row per request (`kvlab.metrics.per_request_table`'s columns)."""
        return per_request_table(self.run)

    def metrics_table(self) -> pd.DataFrame:
        """The scraped time series, one row per scrape (`observed.metrics_series`)."""
        import pandas as pd

        return pd.DataFrame(self.series)

    def detailed(self) -> dict[str, Any]:
        """vLLM's per-request arrays (`--save-detailed`), in request order, plus kvlab's:
        `request_ids`, `scheduled_times` (when the workload wanted each sent), the tokens of
        every streamed chunk, and the prompts' shared blocks."""
        requests = self.requests
        return {
            "input_lens": [r.prompt_len for r in requests],
            "output_lens": [r.num_output_tokens if r.completed else 0 for r in requests],
            "ttfts": [r.ttft_s or 0.0 if r.completed else 0.0 for r in requests],
            "itls": [r.itls_s() for r in requests],
            "latencies": [r.latency_s or 0.0 if r.completed else 0.0 for r in requests],
            "start_times": [r.arrival_s for r in requests],
            "generated_texts": [r.generated_text for r in requests],
            "errors": [r.error or "" for r in requests],
            "kvlab_request_ids": [r.request_id for r in requests],
            "kvlab_statuses": [r.status.value for r in requests],
            "kvlab_max_tokens": [r.max_tokens for r in requests],
            "kvlab_scheduled_times": [r.scheduled_s for r in requests],
            "kvlab_chunk_tokens": [r.chunk_tokens for r in requests],
            "kvlab_num_cached_tokens": [r.num_cached_tokens for r in requests],
            "kvlab_hash_ids": self.hash_ids,
            "kvlab_hash_block_size": self.hash_block_size,
            **self._token_ids(),
            **self._classes(),
        }

    def _classes(self) -> dict[str, Any]:
        """The requests' priorities and SLO classes, kept when any request has one."""
        requests = self.requests
        if not any(r.priority or r.slo_class is not None for r in requests):
            return {}
        return {"kvlab_priorities": [r.priority for r in requests],
                "kvlab_slo_classes": [r.slo_class for r in requests]}

    def _token_ids(self) -> dict[str, Any]:
        """The prompts' and outputs' token ids, kept when KV events were recorded."""
        if self.prompt_token_ids is None:
            return {}
        return {"kvlab_prompt_token_ids": self.prompt_token_ids,
                "kvlab_output_token_ids": [r.output_token_ids for r in self.requests]}

    def to_json(self, summary: dict[str, Any], *, detailed: bool) -> dict[str, Any]:
        """The saved document: the summary, the server, the scrape series and, when
        `detailed`, the per-request arrays (what calibrate --from-bench needs)."""
        document = {**summary, "format": RESULT_FORMAT, "server": self.server.to_json(),
                    "started_at": self.started_at, "metrics_errors": self.metrics_errors}
        if detailed:
            document.update(self.detailed())
            document["kvlab_metrics_series"] = _finite(self.series)
            document["kvlab_host_cpu"] = self.host_cpu
        return document


def _finite(table: dict[str, list[float]]) -> dict[str, list[float | None]]:
    """NaN (not exported) as null: JSON has no NaN."""
    return {k: [None if v != v else v for v in values] for k, values in table.items()}


def peaks(requests: list[BenchRequest]) -> dict[str, Any]:
    """vLLM's `max_output_tokens_per_s` (the most chunks arriving in one second of the run)
    and `max_concurrent_requests` (the most requests in flight in one second), over the
    completed requests, in one-second buckets from the first send."""
    done = [r for r in requests if r.completed]
    if not done:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    origin = min(r.arrival_s for r in done)
    end = max(r.finish_s or r.arrival_s for r in done)
    num_buckets = math.ceil(end - origin) + 1
    tokens = np.zeros(num_buckets)
    concurrent = np.zeros(num_buckets)
    for r in done:
        for time_s in r.chunk_times_s:
            tokens[int(time_s - origin)] += 1
        first, last = int(r.arrival_s - origin), int((r.finish_s or r.arrival_s) - origin)
        concurrent[first : last + 1] += 1
    return {"max_output_tokens_per_s": float(tokens.max()),
            "max_concurrent_requests": int(concurrent.max())}
