"""`kvlab bench serve` as a library: a trace replayed against any OpenAI-compatible server, and
the result in `vllm bench serve`'s keys (report, JSON, `--save-detailed` arrays) plus the KV
section the server's `/metrics` gives and kvlab's tables.

The result is a `BenchResult`: the client's `RunResult` (so that `kvlab.metrics.summarize`
computes every latency exactly as it does for the simulator and the engine), the server's
configuration and the scraped metrics. `calibrate --from-bench` and `validate --base-url` read
it back (`load_bench_result`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvlab.bench.client import (
    ClientConfig,
    ClientRun,
    PlannedRequest,
    get_json,
    is_chat_endpoint,
    reset_prefix_cache,
    run_client,
)
from kvlab.bench.host_cpu import ticks_between
from kvlab.bench.kv_event_stream import KVEventStream, KVEventSubscriber
from kvlab.bench.observed import (
    ServerInfo,
    kv_summary,
    metrics_series,
    server_info,
    server_latency_summary,
)
from kvlab.bench.records import BenchRequest
from kvlab.bench.scrape import parse_metrics
from kvlab.bench.vllm_result import from_vllm_document, is_vllm_bench_result, missing_vllm_keys
from kvlab.errors import KvlabError
from kvlab.metrics import RunResult, StepRecorder, per_request_table, summarize
from kvlab.policies import RequestStatus
from kvlab.traces import Trace, synthesize_prompt_ids

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


def resolve_model(base_url: str, model: str | None, api_key: str | None) -> dict[str, Any]:
    """The /v1/models card of `model` (None: the server's first model); a KvlabError naming
    --model when the server does not serve it."""
    listing = get_json(base_url, "/v1/models", api_key=api_key)
    cards = listing.get("data") if isinstance(listing, dict) else None
    if not cards:
        raise KvlabError(f"{base_url}/v1/models lists no model", parameters=("base_url",))
    if model is None:
        return dict(cards[0])
    for card in cards:
        if card.get("id") == model:
            return dict(card)
    names = ", ".join(str(card.get("id")) for card in cards)
    raise KvlabError(f"model {model!r} is not served by {base_url} (it serves: {names})",
                     parameters=("model",))


def vocab_size_of(card: dict[str, Any], tokenizer: str | None, vocab_size: int | None) -> int:
    """The vocabulary the prompt ids are drawn from: `vocab_size` if given, else the
    config.json of the tokenizer folder (or of the model, when its id is a local folder), else
    the card's `vocab_size` (kvlab serve lists it); a KvlabError naming the flags otherwise."""
    if vocab_size is not None:
        if vocab_size < 1:
            raise KvlabError(f"vocab_size {vocab_size}: expected 1 or more",
                             parameters=("vocab_size",))
        return vocab_size
    for folder in (tokenizer, card.get("root"), card.get("id")):
        config = Path(str(folder)) / "config.json" if folder else None
        if config is not None and config.is_file():
            return _config_vocab(config)
    if isinstance(card.get("vocab_size"), int):
        return int(card["vocab_size"])
    raise KvlabError(
        f"cannot tell the vocabulary of model {card.get('id')!r}: give vocab_size N, or "
        "tokenizer FOLDER (a folder with the model's config.json)",
        parameters=("vocab_size", "tokenizer"),
    )


def _config_vocab(path: Path) -> int:
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError) as exc:
        raise KvlabError(f"{path}: cannot read vocab_size ({exc})") from None
    if not isinstance(value, int) or value < 1:
        raise KvlabError(f"{path}: vocab_size {value!r} is not a positive integer")
    return value


def plan_requests(trace: Trace, vocab_size: int, seed: int,
                  text_of: Callable[[list[int]], str] | None = None) -> list[PlannedRequest]:
    """The trace's requests, each to send at its arrival with its output length as
    max_tokens: its text where the trace has text (ShareGPT; the server tokenizes it), else
    prompt ids (`synthesize_prompt_ids`), turned into text by `text_of` when given (a
    tokenizer's decode: what a chat route needs)."""
    with_ids = synthesize_prompt_ids(trace, vocab_size, seed)
    planned = []
    for r in with_ids.requests:
        prompt: list[int] | str = (r.prompt_text if r.prompt_text is not None
                                   else list(r.prompt_token_ids or ()))
        if text_of is not None and not isinstance(prompt, str):
            prompt = text_of(prompt)
        planned.append(PlannedRequest(r.request_id, prompt, r.input_len, r.output_len,
                                      r.arrival_s, r.priority))
    return planned


def check_chat_prompts(client: ClientConfig, planned: list[PlannedRequest]) -> None:
    """A KvlabError before any request is sent when a chat route would get token ids."""
    if is_chat_endpoint(client.endpoint) and any(not isinstance(p.prompt, str)
                                                 for p in planned):
        raise KvlabError(
            f"--endpoint {client.endpoint} takes chat messages, which are text: give "
            "--tokenizer FOLDER (the served model's tokenizer) to turn the trace's prompt ids "
            "into text, or a dataset with text (--dataset-name sharegpt)",
            parameters=("tokenizer",))


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


def load_bench_result(path: str | Path) -> BenchResult:
    """Read a result that `kvlab bench serve --save-result --save-detailed` wrote, or one of
    vLLM's own `vllm bench serve --save-result --save-detailed` (kvlab.bench.vllm_result: what
    it lacks); a KvlabError naming the file when it is neither, or lacks the per-request
    arrays."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvlabError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise KvlabError(f"{path}: not a JSON result file ({exc})") from None
    if is_vllm_bench_result(document):
        return _vllm_result(path, document)
    if not isinstance(document, dict) or document.get("format") != RESULT_FORMAT:
        raise KvlabError(f"{path}: neither a `kvlab bench serve` result (no format "
                         f"{RESULT_FORMAT!r}) nor a `vllm bench serve` one")
    missing = [key for key in (*DETAILED_KEYS, "kvlab_request_ids", "kvlab_statuses")
               if key not in document]
    if missing:
        raise KvlabError(f"{path}: lacks the per-request arrays ({missing[0]}, ...): save the "
                         "run with --save-result --save-detailed")
    try:
        return _from_document(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise KvlabError(f"{path}: malformed result ({type(exc).__name__}: {exc})") from None


def _vllm_result(path: Path, document: dict[str, Any]) -> BenchResult:
    """A `vllm bench serve` result (kvlab.bench.vllm_result), with its file named on error."""
    missing = missing_vllm_keys(document)
    if missing:
        raise KvlabError(f"{path}: a `vllm bench serve` result without the per-request arrays "
                         f"({missing[0]}, ...): run vllm bench serve with --save-result "
                         "--save-detailed")
    try:
        return BenchResult(**from_vllm_document(document))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise KvlabError(f"{path}: malformed vllm bench result ({type(exc).__name__}: "
                         f"{exc})") from None


def _from_document(d: dict[str, Any]) -> BenchResult:
    requests = []
    for i, request_id in enumerate(d["kvlab_request_ids"]):
        record = BenchRequest(int(request_id), int(d["input_lens"][i]),
                              int(d["kvlab_max_tokens"][i]), float(d["kvlab_scheduled_times"][i]))
        record.arrival_s = float(d["start_times"][i])
        record.status = RequestStatus(d["kvlab_statuses"][i])
        record.error = d["errors"][i] or None
        record.chunk_tokens = [int(n) for n in d["kvlab_chunk_tokens"][i]]
        if record.chunk_tokens:
            first = record.arrival_s + float(d["ttfts"][i])
            record.chunk_times_s = [first, *(first + np.cumsum(d["itls"][i])).tolist()]
        record.num_output_tokens = int(d["output_lens"][i]) or sum(record.chunk_tokens)
        record.num_cached_tokens = int(d["kvlab_num_cached_tokens"][i])
        record.finish_s = (record.arrival_s + float(d["latencies"][i]) if record.completed
                           else record.chunk_times_s[-1] if record.chunk_times_s
                           else record.arrival_s)
        record.generated_text = d["generated_texts"][i]
        if "kvlab_priorities" in d:
            record.priority = int(d["kvlab_priorities"][i])
            record.slo_class = d["kvlab_slo_classes"][i]
        requests.append(record)
    info = ServerInfo.from_json(d["server"])
    itls = [gap for r in requests if r.completed for gap in r.itls_s()]
    keys = ("policy", "model", "hardware", "dataset", "dataset_name", "dataset_source",
            "backend", "endpoint_type", "seed", "request_rate", "burstiness", "time_scale",
            "max_concurrency", "label", "base_url", "slo_classes")
    run = RunResult(
        requests=requests,
        steps=StepRecorder(),
        itls_s=np.array(itls, dtype=np.float64),
        duration_s=float(d["duration"]),
        page_size=info.block_size or 0,
        num_total_pages=info.num_gpu_blocks or 0,
        kv_cache_size_tokens=(info.block_size or 0) * (info.num_gpu_blocks or 0),
        metadata={k: d[k] for k in keys if k in d},
    )
    series = {k: [float("nan") if v is None else float(v) for v in values]
              for k, values in (d.get("kvlab_metrics_series") or {}).items()}
    prompts = d.get("kvlab_prompt_token_ids")
    for record, ids in zip(requests, d.get("kvlab_output_token_ids") or (), strict=False):
        record.output_token_ids = ids
    host_cpu = {k: [float(v) for v in values]
                for k, values in (d.get("kvlab_host_cpu") or {}).items()}
    return BenchResult(run, info, series, float(d["started_at"]), list(d["metrics_errors"]),
                       d["kvlab_hash_ids"], int(d["kvlab_hash_block_size"]),
                       prompt_token_ids=prompts, host_cpu=host_cpu)
