"""The dashboard's Live page figures: a server's `/metrics` scrapes over time (kvlab's or
vLLM's)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import plotly.graph_objects as go

from kvlab.bench.scrape import PRECISION_PAGES, MetricsSample
from kvlab.dashboard.figures import chart_layout
from kvlab.metrics.precision_mix import level_label

# Series of the Live page: (trace name, sample name); the kvlab: ones appear only when served.
LIVE_QUEUES = (("running", "vllm:num_requests_running"), ("waiting", "vllm:num_requests_waiting"),
               ("swapped", "kvlab:num_requests_swapped"))
LIVE_RATES = (("preemptions", "vllm:num_preemptions_total"), ("swaps out", "kvlab:swaps_out_total"),
              ("swaps in", "kvlab:swaps_in_total"),
              ("pages demoted", "kvlab:kv_page_demotions_total"))  # (every level's, summed)


def live_figures(samples: Sequence[MetricsSample]) -> list[go.Figure]:
    """Charts of a server's /metrics over time (seconds since the first scrape): KV-cache usage,
    queues, preemptions, swaps and (a precision policy's) page demotions per second, and the
    prefix-cache hit rate between scrapes; for a server demoting pages (kvlab serve with a
    precision policy), the share of its pages at each precision too."""
    t0 = samples[0].time_s if samples else 0.0
    times = [s.time_s - t0 for s in samples]
    usage = go.Figure(go.Scatter(x=times, y=[100 * s.get("vllm:kv_cache_usage_perc")
                                             for s in samples], name="KV cache usage",
                                 mode="lines+markers"))
    usage.update_yaxes(range=[0, 100])
    queues = go.Figure()
    for name, key in LIVE_QUEUES:
        if any(key in s.values for s in samples):
            queues.add_trace(go.Scatter(x=times, y=[s.get(key) for s in samples], name=name,
                                        mode="lines+markers"))
    pairs = list(itertools.pairwise(samples))
    mids = [(a.time_s + b.time_s) / 2 - t0 for a, b in pairs]
    rates = go.Figure()
    for name, key in LIVE_RATES:
        if any(key in s.values for s in samples):
            rates.add_trace(go.Scatter(x=mids, y=[_rate(a, b, key) for a, b in pairs], name=name,
                                       mode="lines+markers"))
    hits = go.Figure(go.Scatter(x=mids, y=[_hit_rate(a, b) for a, b in pairs],
                                name="prefix-cache hit rate", mode="lines+markers"))
    charts = [
        chart_layout(usage, "KV cache usage", "time (s)", "% of KV memory held"),
        chart_layout(queues, "Requests", "time (s)", "requests"),
        chart_layout(rates, "Preemptions and swaps", "time (s)", "per second"),
        chart_layout(hits, "Prefix-cache hits between scrapes", "time (s)",
                     "% of looked-up tokens"),
    ]
    mix = _live_precision_mix(samples, times)
    return charts if mix is None else [*charts, mix]


def _live_precision_mix(samples: Sequence[MetricsSample], times: list[float]
                        ) -> go.Figure | None:
    """The share of held and cached pages at each precision (kvlab serve's
    `kvlab:kv_pages_at_precision`, by level) at each scrape; None where no scrape has it."""
    keys = sorted({(int(found[1]), found[2], key) for s in samples for key in s.values
                   if (found := PRECISION_PAGES.fullmatch(key))})
    if not keys:
        return None
    fig = go.Figure()
    totals = [sum(s.get(key) for _, _, key in keys) for s in samples]
    for _, dtype, key in keys:
        shares = [100 * s.get(key) / total if total else None
                  for s, total in zip(samples, totals, strict=True)]
        fig.add_trace(go.Scatter(x=times, y=shares, name=level_label(dtype), mode="lines+markers"))
    return chart_layout(fig, "KV precision mix", "time (s)", "% of held and cached pages")


def _rate(a: MetricsSample, b: MetricsSample, key: str) -> float:
    dt = b.time_s - a.time_s
    return (b.get(key) - a.get(key)) / dt if dt > 0 else 0.0


def _hit_rate(a: MetricsSample, b: MetricsSample) -> float | None:
    queries = b.get("vllm:prefix_cache_queries_total") - a.get("vllm:prefix_cache_queries_total")
    hits = b.get("vllm:prefix_cache_hits_total") - a.get("vllm:prefix_cache_hits_total")
    return 100 * hits / queries if queries > 0 else None
