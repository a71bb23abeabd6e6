"""What a server's `/metrics` says about a benchmark run: its KV cache's shape (vLLM's
`cache_config_info`), the run's time series (usage, queues, preemptions, prefix lookups) and
the KV section of the run's summary computed from them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvlab.bench.scrape import PRECISION_PAGES, MetricsSample

CACHE_INFO = "vllm:cache_config_info"
SCHEDULER_INFO = "kvlab:scheduler_config_info"  # kvlab serve's; vLLM 0.32 exports none
# kvlab's vLLM plugin (kvlab.integrations.vllm): the policy its device prefix cache evicts by
EVICTION_INFO = "kvlab:eviction_policy_info"
PREEMPTION_BOUNDS = (0, 1, 2, 3, 4, 5)
# (table column, exposition name, scale): gauges as they are, counters as totals.
SERIES = (
    ("kv_cache_usage_perc", "vllm:kv_cache_usage_perc", 100.0),
    ("num_requests_running", "vllm:num_requests_running", 1.0),
    ("num_requests_waiting", "vllm:num_requests_waiting", 1.0),
    ("num_requests_swapped", "kvlab:num_requests_swapped", 1.0),
    ("num_preemptions_total", "vllm:num_preemptions_total", 1.0),
    ("prefix_cache_queries_total", "vllm:prefix_cache_queries_total", 1.0),
    ("prefix_cache_hits_total", "vllm:prefix_cache_hits_total", 1.0),
    ("swaps_out_total", "kvlab:swaps_out_total", 1.0),
    # vLLM's per-step token histogram: its count is the engine steps run, its sum their tokens
    ("num_steps_total", "vllm:iteration_tokens_total_count", 1.0),
    ("step_tokens_total", "vllm:iteration_tokens_total_sum", 1.0),
    # the server's own TTFT (from when it got each request): the client's minus it is what
    # the API adds (`calibrate --from-bench` fits it as api_latency_s)
    ("ttft_sum_total", "vllm:time_to_first_token_seconds_sum", 1.0),
    ("ttft_count_total", "vllm:time_to_first_token_seconds_count", 1.0),
    # where the server's TTFT went: its engine's queue (from when the engine took the request
    # in, at a step's boundary) and prefill (scheduled to first token), both counted at each
    # request's finish
    ("queue_time_sum_total", "vllm:request_queue_time_seconds_sum", 1.0),
    ("queue_time_count_total", "vllm:request_queue_time_seconds_count", 1.0),
    ("prefill_time_sum_total", "vllm:request_prefill_time_seconds_sum", 1.0),
    ("prefill_time_count_total", "vllm:request_prefill_time_seconds_count", 1.0),
    # finished requests by their number of preemptions (vLLM's buckets le 1..5: 0 and 1
    # together; kvlab serve adds le 0), and their count and sum
    *((f"request_preemptions_le{k}_total",
       f'vllm:request_num_preemptions_bucket{{le="{k}"}}', 1.0) for k in PREEMPTION_BOUNDS),
    ("request_preemptions_count_total", "vllm:request_num_preemptions_count", 1.0),
    ("request_preemptions_sum_total", "vllm:request_num_preemptions_sum", 1.0),
)


# kvlab serve's demotions into each precision level (a scrape keeps them by level and dtype,
# kvlab.bench.scrape.KEPT_LABELS), as series columns and then the summary's keys (the
# simulator's, kvlab.metrics.precision_mix)
_DEMOTIONS = re.compile(r'kvlab:kv_page_demotions_total\{level="(\d+)",dtype="([^"]+)"\}')
DEMOTIONS_COLUMN = re.compile(r"precision_demotions_(\d+)_(.+)_total")
# and its pages at each level (a gauge), as series columns
PAGES_COLUMN = re.compile(r"precision_pages_(\d+)_(.+)")


@dataclass(slots=True, frozen=True)
class ServerInfo:
    """A server's serving configuration as far as it tells: the model list's card and its
    metrics' info series. Fields it does not export are None."""

    model: str
    owned_by: str | None = None
    max_model_len: int | None = None
    vocab_size: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    enable_prefix_caching: bool | None = None
    cache_dtype: str | None = None
    # vLLM's prefix_cache_retention_interval (0.32 on; "None" exported: dense, as before it)
    prefix_cache_retention_interval: int | None = None
    scheduler: dict[str, str] = field(default_factory=dict)
    eviction: str | None = None  # a vLLM with kvlab's plugin: its eviction policy's spec

    def to_json(self) -> dict[str, Any]:
        """The fields as saved with a result."""
        return {
            "model": self.model,
            "owned_by": self.owned_by,
            "max_model_len": self.max_model_len,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_cpu_blocks": self.num_cpu_blocks,
            "enable_prefix_caching": self.enable_prefix_caching,
            "cache_dtype": self.cache_dtype,
            "prefix_cache_retention_interval": self.prefix_cache_retention_interval,
            "scheduler": dict(self.scheduler),
            "eviction": self.eviction,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerInfo:
        """Read back `to_json`'s dict."""
        return cls(**{**data, "scheduler": dict(data.get("scheduler") or {})})


def server_info(card: dict[str, Any], sample: MetricsSample | None) -> ServerInfo:
    """ServerInfo from a /v1/models card and one /metrics sample (None: no metrics)."""
    cache = sample.info.get(CACHE_INFO, {}) if sample is not None else {}
    scheduler = sample.info.get(SCHEDULER_INFO, {}) if sample is not None else {}
    eviction = sample.info.get(EVICTION_INFO, {}) if sample is not None else {}
    return ServerInfo(
        model=str(card.get("id")),
        owned_by=card.get("owned_by"),
        max_model_len=_int(card.get("max_model_len")),
        vocab_size=_int(card.get("vocab_size")),
        block_size=_int(cache.get("block_size")),
        num_gpu_blocks=_int(cache.get("num_gpu_blocks")),
        num_cpu_blocks=_int(cache.get("num_cpu_blocks")),
        enable_prefix_caching=_bool(cache.get("enable_prefix_caching")),
        cache_dtype=cache.get("cache_dtype"),
        prefix_cache_retention_interval=_int(cache.get("prefix_cache_retention_interval")),
        scheduler={k: v for k, v in scheduler.items() if k != "model_name"},
        eviction=eviction.get("policy") or None,
    )


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _bool(value: object) -> bool | None:
    return {"True": True, "False": False, "true": True, "false": False}.get(str(value))


def metrics_series(samples: Sequence[MetricsSample], origin_s: float) -> dict[str, list[float]]:
    """The run's time series, one row per scrape: `time_s` since `origin_s` (the run's start,
    epoch seconds), then SERIES' columns (NaN where the server does not export one; counters
    relative to the first sample), then, from a server demoting pages (kvlab serve with a
    precision policy), `precision_demotions_K_DTYPE_total` for each level K it demoted into
    and `precision_pages_K_DTYPE`, its held and cached pages at each level K."""
    table: dict[str, list[float]] = {"time_s": [s.time_s - origin_s for s in samples]}
    names = dict.fromkeys(key for s in samples for key in s.values)
    demotions = [(f"precision_demotions_{found[1]}_{found[2]}_total", name, 1.0)
                 for name in names if (found := _DEMOTIONS.fullmatch(name))]
    pages = sorted((int(found[1]), f"precision_pages_{found[1]}_{found[2]}", name, 1.0)
                   for name in names if (found := PRECISION_PAGES.fullmatch(name)))
    for column, name, scale in (*SERIES, *demotions, *(page[1:] for page in pages)):
        base = samples[0].values.get(name, 0.0) if column.endswith("_total") and samples else 0.0
        table[column] = [
            (s.values[name] - base) * scale if name in s.values else float("nan")
            for s in samples
        ]
    return table


def series_increase(series: dict[str, list[float]], column: str) -> float | None:
    """A counter's increase over the run: its last scraped value less its first (NaN scrapes
    skipped); None with fewer than two values."""
    values = [v for v in series.get(column, []) if v == v]
    return values[-1] - values[0] if len(values) >= 2 else None


def kv_summary(series: dict[str, list[float]], info: ServerInfo) -> dict[str, Any]:
    """The summary's KV-cache keys from a run's `metrics_series` (None where the server does
    not export what a key needs):

    - mean_kv_usage_perc: mean of `kv_cache_usage_perc` over the scrapes that saw a request
      running (scrapes are evenly spaced, so this is a time mean over the busy time, as the
      simulator's step-weighted mean); peak_kv_usage_perc: the largest scraped (a peak between
      two scrapes goes unseen);
    - num_preemptions, num_swaps_out: the counters' increase over the run;
    - prefix_cache_hit_rate_perc: hit tokens over looked-up tokens during the run, in percent;
    - page_size, num_total_pages, kv_cache_size_tokens: from cache_config_info;
    - precision_demotions_K_DTYPE: a demoting server's pages demoted into level K during the
      run (its counters' increase; the simulator's keys of the same name);
      precision_share_K_DTYPE: its pages at level K over its pages at all levels, summed over
      the scrapes that saw a request running (the simulator sums its steps so);
      precision_levels: the levels' dtypes, level 0 first.
    """
    usage = series.get("kv_cache_usage_perc", [])
    running = series.get("num_requests_running", [])
    seen = [u for u in usage if u == u]
    busy = [u for u, n in zip(usage, running, strict=True) if u == u and n == n and n > 0]

    def increase(column: str) -> float | None:
        return series_increase(series, column)

    preemptions, swaps = increase("num_preemptions_total"), increase("swaps_out_total")
    queries, hits = increase("prefix_cache_queries_total"), increase("prefix_cache_hits_total")
    hit_rate = None
    if queries is not None and hits is not None:
        hit_rate = 100.0 * hits / queries if queries > 0 else 0.0
    pages, page_size = info.num_gpu_blocks, info.block_size
    demoted = {f"precision_demotions_{found[1]}_{found[2]}": int(increase(column) or 0)
               for column in series if (found := DEMOTIONS_COLUMN.fullmatch(column))}
    return {
        **demoted,
        **_precision_shares(series, running),
        "mean_kv_usage_perc": sum(busy) / len(busy) if busy else None,
        "peak_kv_usage_perc": max(seen) if seen else None,
        "num_preemptions": None if preemptions is None else int(preemptions),
        "num_swaps_out": None if swaps is None else int(swaps),
        "prefix_cache_hit_rate_perc": hit_rate,
        "page_size": page_size,
        "num_total_pages": pages,
        "kv_cache_size_tokens": pages * page_size if pages and page_size else None,
    }


def server_latency_summary(series: dict[str, list[float]]) -> dict[str, float | None]:
    """The server's own view of the run's first tokens, in ms, means over the requests it
    counted (None where it exports no such histogram): `server_mean_ttft_ms` (from when its
    front end took a request in), `server_mean_queue_time_ms` (waiting to be scheduled) and
    `server_mean_prefill_time_ms` (scheduled to first token). The client's TTFT less the
    first is its API; the first less the other two, what the server spends outside its
    engine's queue and steps (vLLM: its front end and the hand-over to its engine process)."""
    return {"server_mean_ttft_ms": histogram_mean_ms(series, "ttft"),
            "server_mean_queue_time_ms": histogram_mean_ms(series, "queue_time"),
            "server_mean_prefill_time_ms": histogram_mean_ms(series, "prefill_time")}


def histogram_mean_ms(series: dict[str, list[float]], column: str) -> float | None:
    """The mean, in ms, of what a seconds histogram observed during the run (its
    `<column>_sum_total` increase over its `<column>_count_total` increase); None where the
    server exports none or counted nothing."""
    total = series_increase(series, f"{column}_sum_total")
    count = series_increase(series, f"{column}_count_total")
    return 1000.0 * total / count if total is not None and count and count > 0 else None


def preemptions_per_request(series: dict[str, list[float]]) -> dict[int, int] | None:
    """{number of preemptions: finished requests with that many} over the run, from the
    server's vllm:request_num_preemptions histogram (None without one). Exact up to 5; the
    requests preempted more often count under 6. vLLM's first bucket holds 0 and 1: they
    are told apart by the histogram's sum."""

    def increase(column: str) -> int | None:
        value = series_increase(series, column)
        return None if value is None else int(value)

    count = increase("request_preemptions_count_total")
    total = increase("request_preemptions_sum_total")
    at_most = {k: increase(f"request_preemptions_le{k}_total") for k in PREEMPTION_BOUNDS}
    if count is None or total is None or any(at_most[k] is None for k in range(1, 6)):
        return None
    le = {k: v for k, v in at_most.items() if v is not None}
    out = {k: le[k] - le[k - 1] for k in range(2, 6)}
    out[6] = count - le[5]
    if 0 in le:
        out[0], out[1] = le[0], le[1] - le[0]
    elif out[6]:
        return None  # requests preempted 6+ times hide how many had exactly one
    else:
        out[1] = total - sum(k * n for k, n in out.items())
        out[0] = le[1] - out[1]
    return {k: n for k, n in sorted(out.items()) if n}


def _precision_shares(series: dict[str, list[float]], running: list[float]) -> dict[str, Any]:
    """`kv_summary`'s precision_share_K_DTYPE and precision_levels: each level's pages summed
    over the busy scrapes, over all levels' (none for a server that demotes nothing)."""
    levels = sorted((int(found[1]), found[2], column) for column in series
                    if (found := PAGES_COLUMN.fullmatch(column)))
    if len(levels) < 2:
        return {}
    sums = [sum(p for p, n in zip(series[column], running, strict=True)
                if p == p and n == n and n > 0) for _, _, column in levels]
    total = sum(sums)
    if not total:
        return {}
    out: dict[str, Any] = {"precision_levels": "/".join(dtype for _, dtype, _ in levels)}
    for (level, dtype, _), pages in zip(levels, sums, strict=True):
        out[f"precision_share_{level}_{dtype}"] = pages / total
    return out
