"""A server's benchmarks of one window (its repeats) or of several windows pooled into one
summary, and the server's own spread over the repeats: how far one run strays from the pooled
value and how sure the pool is of it (the relative standard error of its means).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from kvlab.bench import BenchResult
from kvlab.bench.observed import series_increase
from kvlab.fidelity.from_bench import SUMMARY_OPTIONS
from kvlab.fidelity.validation import WINDOW_METRICS
from kvlab.metrics import RunResult, merge_runs, summarize
from kvlab.metrics.precision_mix import DEMOTIONS_KEY


def summarize_run(result: RunResult) -> dict[str, Any]:
    """A run's summary with the options a server's benchmark is summarized with, so that the
    simulator's and the server's summaries compare key for key."""
    return summarize(result, **SUMMARY_OPTIONS)


def pooled_server_summary(results: Sequence[BenchResult]) -> dict[str, Any]:
    """Benchmarks (windows, or repeats of one) as one summary: latencies and throughputs
    over the pooled requests (`merge_runs`), the KV section pooled as well (usage means
    weighted by duration, peaks the largest, counters added up, hit rate over all lookups)."""
    summaries = [result.summary(**SUMMARY_OPTIONS) for result in results]
    if len(results) == 1:
        return summaries[0]
    pooled = summarize_run(merge_runs([result.run for result in results]))
    for key in ("mean_kv_usage_perc", "peak_kv_usage_perc", "num_preemptions",
                "num_swaps_out", "prefix_cache_hit_rate_perc", "page_size", "num_total_pages",
                "kv_cache_size_tokens", "num_swaps_in", "kv_token_state_perc",
                "internal_fragmentation_perc", "external_fragmentation_perc",
                "num_swap_out_pages", "num_swap_in_pages", "num_host_pages"):
        pooled.pop(key, None)
    pooled.update(_pooled_kv(summaries, [result.run.duration_s for result in results],
                             results))
    pooled["host_cpu_steal_perc"] = pooled_steal_perc(results)
    pooled["dataset"] = f"{summaries[0].get('dataset')} and {len(results) - 1} more runs"
    return pooled


def _pooled_kv(summaries: list[dict[str, Any]], durations: list[float],
               results: Sequence[BenchResult]) -> dict[str, Any]:
    def values(key: str) -> list[Any]:
        return [s.get(key) for s in summaries]

    def total(key: str) -> Any:
        found = values(key)
        return None if any(v is None for v in found) else sum(found)

    means = values("mean_kv_usage_perc")
    weighted = (None if any(v is None for v in means) or not sum(durations) else
                sum(m * d for m, d in zip(means, durations, strict=True)) / sum(durations))
    peaks = [v for v in values("peak_kv_usage_perc") if v is not None]
    queries = sum(_increase(r, "prefix_cache_queries_total") for r in results)
    hits = sum(_increase(r, "prefix_cache_hits_total") for r in results)
    first = summaries[0]
    demoted = {key: total(key) for key in first if DEMOTIONS_KEY.fullmatch(key)}
    if demoted and None not in demoted.values() and sum(durations):
        demoted["precision_demotions_per_s"] = sum(demoted.values()) / sum(durations)
    return {
        **demoted,
        **_pooled_shares(summaries, durations),
        "mean_kv_usage_perc": weighted,
        "peak_kv_usage_perc": max(peaks) if peaks else None,
        "num_preemptions": total("num_preemptions"),
        "num_swaps_out": total("num_swaps_out"),
        "prefix_cache_hit_rate_perc": (100.0 * hits / queries if queries else
                                  first.get("prefix_cache_hit_rate_perc")),
        "page_size": first.get("page_size"),
        "num_total_pages": first.get("num_total_pages"),
        "kv_cache_size_tokens": first.get("kv_cache_size_tokens"),
    }


def pooled_steal_perc(results: Sequence[BenchResult]) -> float | None:
    """The client host's CPU share that the hypervisor withheld over all the runs
    (their ticks added up), in percent; None where a run does not tell."""
    ticks = [result.host_cpu_ticks() for result in results]
    known = [pair for pair in ticks if pair is not None]
    if not known or len(known) < len(ticks):
        return None
    return 100.0 * sum(steal for steal, _ in known) / sum(total for _, total in known)


def _increase(result: BenchResult, column: str) -> float:
    return series_increase(result.series, column) or 0.0


def repeat_spread(benches: Sequence[BenchResult],
                  pooled: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The server's own spread over repeats of one window (`pooled`: their pooled summary),
    per window metric: each repeat's value, the largest relative distance of one from the
    pooled value (how far a single run of this window strays from what the server does on
    it on average: no prediction of one run can be surer than that), and the relative
    standard error of their mean (how sure the pool itself is of that average; it shrinks
    with the square root of the number of runs)."""
    summaries = [bench.summary(**SUMMARY_OPTIONS) for bench in benches]
    spread: dict[str, dict[str, Any]] = {}
    for key in WINDOW_METRICS:
        values = [summary.get(key) for summary in summaries]
        centre = pooled.get(key)
        known = [float(v) for v in values if v is not None]
        deviation = (max(abs(v - float(centre)) for v in known) / abs(float(centre))
                     if known and centre else None)
        spread[key] = {"values": values, "pooled": centre, "max_rel_deviation": deviation,
                       "rel_std_error": relative_std_error(known, centre)}
    return spread


def relative_std_error(values: list[float], centre: float | None) -> float | None:
    """The standard error of the mean of `values` (sample deviation over sqrt(n)), relative to
    `centre`; None with fewer than two values or no centre."""
    if len(values) < 2 or not centre:
        return None
    return statistics.stdev(values) / math.sqrt(len(values)) / abs(float(centre))


def max_pool_std_error(validated: Sequence[Sequence[BenchResult]]) -> float:
    """The largest relative standard error of any window's pooled server mean throughput,
    TTFT or TPOT, over its runs so far (`validated`: each window's runs); inf while a window
    has fewer than two runs."""
    errors = [spread["rel_std_error"]
              for benches in validated
              for spread in repeat_spread(benches, pooled_server_summary(benches)).values()]
    return max((math.inf if error is None else error for error in errors), default=math.inf)


def _pooled_shares(summaries: list[dict[str, Any]], durations: list[float]) -> dict[str, Any]:
    """A demoting server's precision shares over its runs: each run's weighted by its duration
    (as its usage mean), where every run has them; its levels as the first names them."""
    first = summaries[0]
    keys = [key for key in first if key.startswith("precision_share_")]
    if not keys or not sum(durations) or any(key not in s for s in summaries for key in keys):
        return {}
    shares = {key: sum(s[key] * d for s, d in zip(summaries, durations, strict=True))
              / sum(durations) for key in keys}
    return {"precision_levels": first.get("precision_levels"), **shares}
