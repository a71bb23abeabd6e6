"""`kvlab bench serve` as a library: a trace replayed against any OpenAI-compatible server
(warm-ups first, the server's prefix cache reset and its KV events subscribed to where asked),
and the client's run made a `BenchResult` (`kvlab.bench.result`: vLLM's keys, the KV section
from the server's `/metrics`). What is sent is planned in `kvlab.bench.request_plan`; a saved
result is read back by `kvlab.bench.result_files.load_bench_result`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kvlab.bench.client import (
    ClientConfig,
    ClientRun,
    PlannedRequest,
    reset_prefix_cache,
    run_client,
)
from kvlab.bench.kv_event_stream import KVEventSubscriber
from kvlab.bench.observed import metrics_series, server_info
from kvlab.bench.records import BenchRequest
from kvlab.bench.request_plan import check_chat_prompts, plan_requests
from kvlab.bench.result import BenchResult
from kvlab.bench.scrape import parse_metrics
from kvlab.errors import KvlabError
from kvlab.metrics import RunResult, StepRecorder
from kvlab.traces import Trace


def bench_serve(
    trace: Trace,
    client: ClientConfig,
    *,
    card: dict[str, Any],
    vocab_size: int,
    seed: int = 0,
    num_warmups: int = 0,
    metadata: dict[str, Any] | None = None,
    on_finish: Callable[[BenchRequest], object] | None = None,
    kv_events: str | None = None,
    reset_cache: bool = False,
    text_of: Callable[[list[int]], str] | None = None,
) -> BenchResult:
    """Replay `trace` against the server and collect the result. `num_warmups` requests (the
    first planned request's shape) are sent first and left out of every metric. `kv_events`
    (a ZMQ endpoint) subscribes to the server's KV events for the run (warm-ups excluded) into
    `result.kv_events`. `reset_cache` empties the server's prefix cache first (after the
    warm-ups), so that the run starts from the empty cache a replay starts from. `text_of`
    turns prompt ids into text (`plan_requests`); a chat route needs it for id prompts."""
    planned = plan_requests(trace, vocab_size, seed, text_of)
    check_chat_prompts(client, planned)
    if num_warmups > 0 and planned:
        warm = [PlannedRequest(-1 - i, planned[0].prompt, planned[0].prompt_len,
                               planned[0].max_tokens, 0.0) for i in range(num_warmups)]
        failed = [r for r in run_client(client, warm).requests if not r.completed]
        if failed:
            raise KvlabError(f"warm-up request failed: {failed[0].error}",
                             parameters=("num_warmups",))
    if reset_cache:
        reset_prefix_cache(client.base_url, api_key=client.api_key)
    subscriber = None if kv_events is None else KVEventSubscriber(kv_events).start()
    ran = run_client(client, planned, on_finish=on_finish)
    if client.request_id_prefix is not None:  # (what a scheduler's log names them by)
        metadata = {"request_id_prefix": client.request_id_prefix, **(metadata or {})}
    result = bench_result(ran, trace, card, metadata or {})
    if subscriber is not None:
        result.kv_events = subscriber.stop(ran.started_at)
        result.prompt_token_ids = [
            list(p.prompt) if isinstance(p.prompt, list) else record.prompt_token_ids or []
            for p, record in zip(sorted(planned, key=lambda p: p.request_id), result.requests,
                                 strict=True)]
    return result


def bench_result(ran: ClientRun, trace: Trace, card: dict[str, Any],
                 metadata: dict[str, Any]) -> BenchResult:
    """A client run as a BenchResult (its records in request-id order)."""
    samples = [parse_metrics(text, time_s) for time_s, text in ran.metrics_pages]
    info = server_info(card, samples[-1] if samples else None)
    series = metrics_series(samples, ran.started_at)
    records = sorted(ran.requests, key=lambda r: r.request_id)
    itls = [gap for r in records if r.completed for gap in r.itls_s()]
    pages = info.num_gpu_blocks or 0
    page_size = info.block_size or 0
    run = RunResult(
        requests=records,
        steps=StepRecorder(),
        itls_s=np.array(itls, dtype=np.float64),
        duration_s=ran.duration_s,
        page_size=page_size,
        num_total_pages=pages,
        kv_cache_size_tokens=pages * page_size,
        metadata={"backend": "openai", "endpoint_type": "openai", "model": info.model,
                  "policy": info.scheduler.get("policy"),
                  "hardware": f"server ({info.owned_by or 'unknown'})",
                  **trace.result_metadata(), **metadata},
    )
    by_id = {r.request_id: r for r in trace.requests}
    for record in records:
        record.priority, record.slo_class = (by_id[record.request_id].priority,
                                             by_id[record.request_id].slo_class)
    hash_ids = [list(h) if (h := by_id[r.request_id].hash_ids) else None for r in records]
    block = trace.requests[0].hash_block_size if trace.requests else 512
    return BenchResult(run, info, series, ran.started_at, ran.metrics_errors, hash_ids, block,
                       host_cpu=_host_cpu_table(ran))


def _host_cpu_table(ran: ClientRun) -> dict[str, list[float]]:
    """The client run's host CPU samples as columns (time since the run's start)."""
    if not ran.host_cpu:
        return {}
    times, steal, total = zip(*ran.host_cpu, strict=True)
    return {"time_s": [t - ran.started_at for t in times], "steal_ticks": list(steal),
            "total_ticks": list(total)}
