"""Benchmark metrics of a finished run: vLLM's bench keys plus KV-cache memory metrics.

Both the simulator (`kvlab sim`) and the real engine (`kvlab run`) end with a `RunResult`;
`summarize` turns it into the flat, JSON-ready dict that `kvlab.cli.report` prints and
`kvlab.metrics.results` saves. Torch-free: numpy and pandas only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvlab.errors import KvlabError
from kvlab.metrics.classes import count_priority_inversions, jain_index, request_classes
from kvlab.metrics.exact import exact_sum
from kvlab.metrics.failures import failed_reasons
from kvlab.metrics.precision_mix import used_pages_in_bytes
from kvlab.metrics.records import StepRecorder
from kvlab.metrics.run_result import COMPLETED_STATUSES, RequestRecord, RunResult
from kvlab.metrics.summary_options import (
    PERCENTILE_METRICS,
    check_goodput,
    check_percentile_metrics,
    check_percentiles,
    percentile_label,
)

METADATA_KEYS = ("policy", "model", "hardware", "dataset", "seed", "backend")


@dataclass(slots=True)
class RequestArrays:
    """Per-request columns as numpy arrays (NaN where a timestamp is missing)."""

    request_id: np.ndarray
    arrival_s: np.ndarray
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    num_cached_tokens: np.ndarray
    num_preemptions: np.ndarray
    num_swaps_out: np.ndarray
    completed: np.ndarray

    @property
    def ttft_s(self) -> np.ndarray:
        """Time to first token: the first token's stamp minus arrival."""
        return self.first_token_s - self.arrival_s

    @property
    def e2el_s(self) -> np.ndarray:
        """End-to-end latency: finish minus arrival."""
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Time per output token after the first; NaN with one output token or fewer."""
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = (self.e2el_s - self.ttft_s) / (self.output_len - 1)
        return np.where(self.output_len > 1, tpot, np.nan)


def request_arrays(requests: Sequence[RequestRecord]) -> RequestArrays:
    def floats(name: str) -> np.ndarray:
        # None -> NaN: numpy converts None when the dtype is float.
        return np.array([getattr(r, name) for r in requests], dtype=np.float64)

    def ints(name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in requests], dtype=np.int64)

    completed = np.array([r.status.value in COMPLETED_STATUSES for r in requests], dtype=bool)
    arrays = RequestArrays(
        request_id=ints("request_id"),
        arrival_s=floats("arrival_s"),
        first_scheduled_s=floats("first_scheduled_s"),
        first_token_s=floats("first_token_s"),
        finish_s=floats("finish_s"),
        input_len=ints("prompt_len"),
        output_len=ints("num_output_tokens"),
        num_cached_tokens=ints("num_cached_tokens"),
        num_preemptions=ints("num_preemptions"),
        num_swaps_out=ints("num_swaps_out"),
        completed=completed,
    )
    missing = completed & (np.isnan(arrays.first_token_s) | np.isnan(arrays.finish_s))
    if missing.any():
        bad = arrays.request_id[missing][:5].tolist()
        raise ValueError(f"completed requests {bad} lack first_token_s or finish_s")
    return arrays


def _distribution(name: str, values: np.ndarray, percentiles: Sequence[float]) -> dict:
    """mean/median/std/pP of one latency metric in ms; every key is 0.0 when it is empty."""
    ms = values * 1000.0 if values.size else np.zeros(1)
    # One partition pass for the median and every percentile (the median is the 50th).
    median, *points = np.percentile(ms, [50.0, *percentiles])
    stats = {
        f"mean_{name}_ms": float(np.mean(ms)),
        f"median_{name}_ms": float(median),
        f"std_{name}_ms": float(np.std(ms)),
    }
    for p, value in zip(percentiles, points, strict=True):
        stats[f"p{percentile_label(p)}_{name}_ms"] = float(value)
    return stats


def _num_good(arrays: RequestArrays, slos_ms: dict[str, float]) -> int:
    """Completed requests meeting every SLO (value <= SLO, as vLLM's goodput)."""
    good = arrays.completed.copy()
    # A one-token request has TPOT 0 for goodput, as in vLLM.
    tpot = np.nan_to_num(arrays.tpot_s, nan=0.0)
    values = {"ttft": arrays.ttft_s, "tpot": tpot, "e2el": arrays.e2el_s}
    for name, slo_ms in slos_ms.items():
        good &= values[name] * 1000.0 <= slo_ms
    return int(good.sum())


def count_good_requests(result: RunResult, slos_ms: dict[str, float],
                        slo_class: str | None = None) -> tuple[int, int]:
    """(good, total): the run's completed requests meeting every SLO (milliseconds keyed
    ttft/tpot/e2el), as `request_goodput` counts them, and the requests counted; with
    `slo_class`, of that class only (a KvlabError naming the classes when the run has no
    such class). good / total is vLLM's goodput as a share."""
    check_goodput(slos_ms)
    requests = result.requests
    if slo_class is not None:
        found = request_classes(requests)
        names = found[0] if found is not None else []
        requests = [r for r, name in zip(requests, names, strict=True) if name == slo_class]
        if not requests:
            raise KvlabError(f"slo_class {slo_class!r}: no request of the run is in it "
                             f"(classes: {', '.join(sorted(set(names))) or 'none'})",
                             parameters=("slo_class",))
    return _num_good(request_arrays(requests), slos_ms), len(requests)


def step_columns(steps: StepRecorder) -> dict[str, np.ndarray]:
    """The recorder's columns as numpy arrays (copies), STEP_COLUMNS first."""
    return {name: np.array(column) for name, column in steps.ordered_columns().items()}


def _time_weighted_ratio(weights: np.ndarray, num: np.ndarray, den: np.ndarray) -> float:
    """sum(w * num) / sum(w * den) in percent, summed exactly; 0.0 when the denominator is 0."""
    den_sum = exact_sum(weights * den)
    return 100.0 * exact_sum(weights * num) / den_sum if den_sum > 0 else 0.0


def _kv_stats(result: RunResult) -> dict:
    """KV-memory metrics over the engine steps, each step weighted by its duration."""
    cols = step_columns(result.steps)
    weights = cols["duration_s"]
    if weights.size and not weights.sum() > 0:
        weights = np.ones_like(weights)  # all steps took no time: weigh them equally
    total_pages = result.num_total_pages
    used = cols["num_used_pages"].astype(np.float64)
    held_slots = used * result.page_size
    filled = used_pages_in_bytes(cols).astype(np.float64)  # (demoted pages fill less)
    constant_total = np.full_like(used, float(total_pages))
    return {
        "mean_kv_usage_perc": _time_weighted_ratio(weights, filled, constant_total),
        "peak_kv_usage_perc": (
            100.0 * float(filled.max()) / total_pages if used.size and total_pages else 0.0
        ),
        "kv_token_state_perc": _time_weighted_ratio(
            weights, cols["num_live_token_slots"], held_slots
        ),
        "internal_fragmentation_perc": _time_weighted_ratio(
            weights, cols["num_internal_frag_slots"], held_slots
        ),
        "external_fragmentation_perc": _time_weighted_ratio(
            weights, cols["num_external_frag_pages"], constant_total
        ),
        "num_swap_out_pages": int(cols["num_swap_out_pages"].sum()),
        "num_swap_in_pages": int(cols["num_swap_in_pages"].sum()),
    }


def _prefix_cache_hit_rate_perc(arrays: RequestArrays) -> float:
    """Prompt tokens served from the prefix cache over prompt tokens looked up, in percent."""
    looked_up = ~np.isnan(arrays.first_scheduled_s)
    prompt_tokens = int(arrays.input_len[looked_up].sum())
    hits = int(arrays.num_cached_tokens[looked_up].sum())
    return 100.0 * hits / prompt_tokens if prompt_tokens else 0.0


def _metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The run's description, with the standard keys always present (None when unknown)."""
    out: dict[str, Any] = dict.fromkeys(METADATA_KEYS)
    for key, value in metadata.items():
        if isinstance(value, np.generic):
            value = value.item()
        # vLLM saves an unbounded request rate as the string "inf"; JSON has no infinity.
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        out[key] = value
    return out


def summarize(
    result: RunResult,
    *,
    percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl"),
    metric_percentiles: Sequence[float] = (99,),
    goodput_slos: dict[str, float] | None = None,
) -> dict:
    """The run's summary: vLLM's bench keys, KV-cache metrics, then the run's metadata.

    Latency metrics and token totals cover completed requests (FINISHED_STOPPED or
    FINISHED_LENGTH); every other request counts as failed. TTFT = first token - arrival,
    E2EL = finish - arrival, TPOT = (E2EL - TTFT) / (output_len - 1) over requests with more
    than one output token, ITL = `result.itls_s`. Empty metrics are 0.0, as in vLLM; rates over
    a zero duration are 0.0. `goodput_slos` are milliseconds keyed ttft/tpot/e2el; when given,
    `request_goodput` is the completed requests meeting every SLO per second.

    KV metrics, with each engine step weighted by its duration (idle gaps between steps hold no
    weight), all in percent:
    - mean_kv_usage_perc: mean of used pages / total pages; peak_kv_usage_perc: its maximum.
    - kv_token_state_perc: sum(w * live token slots) / sum(w * held slots), held slots = used
      pages x page_size: the share of memory held by requests (reservations and internal
      fragmentation included) that stores real token states, the PagedAttention paper's metric.
    - internal_fragmentation_perc: sum(w * allocated-but-empty slots) / sum(w * held slots).
    - external_fragmentation_perc: sum(w * free-but-unusable pages) / sum(w * total pages).
    - prefix_cache_hit_rate_perc: from the requests, sum(num_cached_tokens) / sum(prompt_len) over
      requests that were scheduled at least once (the prompt tokens looked up at first schedule).
    Counters: num_preemptions (events, recompute and swap), num_swaps_out (events: a request
    swapped out), num_swaps_in (events, counted from requests that completed: each of their
    swap-outs was followed by a swap-in, since a request finishes on the device),
    num_swap_out_pages / num_swap_in_pages (pages moved, from the steps).
    """
    check_percentile_metrics(percentile_metrics)
    check_percentiles(metric_percentiles)
    if goodput_slos is not None:
        check_goodput(goodput_slos)
    arrays = request_arrays(result.requests)
    done = arrays.completed
    duration = float(result.duration_s)
    num_completed = int(done.sum())
    total_input = int(arrays.input_len[done].sum())
    total_output = int(arrays.output_len[done].sum())

    def per_second(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    summary: dict[str, Any] = {
        "duration": duration,
        "completed": num_completed,
        "failed": len(result.requests) - num_completed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_second(num_completed),
    }
    # vLLM's key is there with or without an SLO: null without (the report skips it)
    summary["request_goodput"] = (per_second(_num_good(arrays, goodput_slos)) if goodput_slos
                                  else None)
    summary["output_throughput"] = per_second(total_output)
    summary["total_token_throughput"] = per_second(total_input + total_output)

    tpot = arrays.tpot_s[done]
    values = {
        "ttft": arrays.ttft_s[done],
        "tpot": tpot[~np.isnan(tpot)],
        "itl": np.asarray(result.itls_s, dtype=np.float64),
        "e2el": arrays.e2el_s[done],
    }
    for name in PERCENTILE_METRICS:
        if name in percentile_metrics:
            summary.update(_distribution(name, values[name], metric_percentiles))

    summary["failed_reasons"] = failed_reasons(result.requests)  # kvlab's, after vLLM's keys
    summary["num_preemptions"] = int(arrays.num_preemptions.sum())
    summary["num_swaps_out"] = int(arrays.num_swaps_out.sum())
    summary["num_swaps_in"] = int(arrays.num_swaps_out[done].sum())
    summary["prefix_cache_hit_rate_perc"] = _prefix_cache_hit_rate_perc(arrays)
    summary.update(_kv_stats(result))
    summary["kv_cache_size_tokens"] = int(result.kv_cache_size_tokens)
    summary["page_size"] = int(result.page_size)
    summary["num_total_pages"] = int(result.num_total_pages)
    summary["num_host_pages"] = int(result.num_host_pages)
    summary.update(_class_stats(result, arrays, percentile_metrics, metric_percentiles,
                                goodput_slos, per_second))
    metadata = _metadata(result.metadata)
    clash = sorted(set(metadata) & set(summary))
    assert not clash, f"metadata keys {clash} shadow metric keys"
    summary.update(metadata)
    return summary


def _class_stats(result: RunResult, arrays: RequestArrays, percentile_metrics: Sequence[str],
                 metric_percentiles: Sequence[float], goodput_slos: dict[str, float] | None,
                 per_second: Any) -> dict[str, Any]:
    """`classes` (per SLO class: counts, throughput, goodput and its share, latency
    percentiles, preemptions, prefix hit rate), `fairness_jain` (Jain's index over the classes'
    goodput shares; None unless two or more classes have SLOs) and `num_priority_inversions`;
    nothing for a run without classes (`kvlab.metrics.classes`). A class's SLOs are its own
    (a workload spec's, in the metadata's `slo_classes`), else `goodput_slos`."""
    found = request_classes(result.requests)
    if found is None:
        return {}
    names, priorities = found
    class_slos = result.metadata.get("slo_classes") or {}
    done = arrays.completed
    tpot = arrays.tpot_s
    classes: dict[str, dict[str, Any]] = {}
    shares = []
    for name in sorted(set(names)):
        mask = np.array([n == name for n in names], dtype=bool)
        sub = RequestArrays(*(getattr(arrays, f)[mask] for f in RequestArrays.__slots__))
        ok = done[mask]
        stats: dict[str, Any] = {
            "completed": int(ok.sum()),
            "failed": int((~ok).sum()),
            "request_throughput": per_second(int(ok.sum())),
        }
        slos = class_slos.get(name, goodput_slos)
        if slos:
            num_good = _num_good(sub, slos)
            stats["request_goodput"] = per_second(num_good)
            stats["goodput_perc"] = 100.0 * num_good / int(mask.sum())
            shares.append(stats["goodput_perc"])
        values = {"ttft": sub.ttft_s[ok], "tpot": tpot[mask][ok], "e2el": sub.e2el_s[ok]}
        values["tpot"] = values["tpot"][~np.isnan(values["tpot"])]
        for metric in ("ttft", "tpot", "e2el"):
            if metric in percentile_metrics or metric == "e2el":
                stats.update(_distribution(metric, values[metric], metric_percentiles))
        stats["num_preemptions"] = int(sub.num_preemptions.sum())
        stats["prefix_cache_hit_rate_perc"] = _prefix_cache_hit_rate_perc(sub)
        classes[name] = stats
    return {
        "classes": classes,
        "fairness_jain": jain_index(shares) if len(shares) >= 2 else None,
        "num_priority_inversions": count_priority_inversions(
            arrays.arrival_s, arrays.first_scheduled_s, priorities),
    }
