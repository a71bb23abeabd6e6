"""Plotly figure builders of the dashboard: pure functions of result tables (no Streamlit).

Every builder names its traces after what they show, so tests (and users hovering the legend) can
tell the series apart. Long per-step series are thinned to at most `max_points` time bins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvlab.dashboard.pagemap import CACHED, FREE, SHARED, PageMap
from kvlab.metrics.precision_mix import used_pages_in_bytes
from kvlab.plots.html import to_plotly
from kvlab.plots.load import RunData
from kvlab.plots.model import Figure
from kvlab.plots.precision import precision_panels

MAX_POINTS = 1500
# The memory states of the stacked KV chart, bottom to top, with their colours.
KV_LAYERS = (
    ("real tokens", "#2e7d32"),
    ("internal fragmentation", "#f9a825"),
    ("cached prefix pages", "#1e88e5"),
    ("free", "#cfd8dc"),
)
QUEUE_SERIES = (("running", "num_running"), ("waiting", "num_waiting"),
                ("swapped", "num_swapped"))
EVENT_SERIES = (("preemptions", "num_preempted"), ("pages swapped out", "num_swap_out_pages"),
                ("pages swapped in", "num_swap_in_pages"))
_NO_PAGE = -(2**62)  # padding cells after the last page
_REQUEST_COLOURS = ("#3949ab", "#00897b", "#8e24aa", "#6d4c41", "#c62828", "#00838f",
                    "#5e35b1", "#2e7d32", "#ad1457", "#4e342e")


def thin_steps(steps: pd.DataFrame, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """At most `max_points` rows: consecutive steps averaged in equal-count bins.

    Averaging (not sampling every k-th step) keeps the area under each series, so a thinned chart
    shows the same time-averaged memory as the summary.
    """
    if len(steps) <= max_points:
        return steps
    bins = np.arange(len(steps)) * max_points // len(steps)
    return steps.groupby(bins).mean(numeric_only=True).reset_index(drop=True)


def chart_layout(fig: go.Figure, title: str, x_title: str, y_title: str) -> go.Figure:
    """`fig` titled, its axes named, its legend below it (every dashboard chart's layout)."""
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title,
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 50, "b": 10},
                      hovermode="x unified")
    return fig


def kv_memory_figure(steps: pd.DataFrame, page_size: int, *,
                     max_points: int = MAX_POINTS) -> go.Figure:
    """KV memory over time as stacked areas, in tokens: real tokens, internal fragmentation,
    cached prefix pages and free, which sum to the whole cache at every step."""
    thin = thin_steps(steps, max_points)
    values = {
        "real tokens": thin["num_live_token_slots"],
        "internal fragmentation": thin["num_internal_frag_slots"],
        "cached prefix pages": thin["num_cached_free_pages"] * page_size,
        "free": thin["num_free_pages"] * page_size,
    }
    fig = go.Figure()
    for name, colour in KV_LAYERS:
        fig.add_trace(go.Scatter(x=thin["start_s"], y=values[name], name=name, mode="lines",
                                 stackgroup="kv", line={"width": 0.5, "color": colour}))
    return chart_layout(fig, "KV cache over time", "time (s)", "token slots")


def queue_figure(steps: pd.DataFrame, *, max_points: int = MAX_POINTS) -> go.Figure:
    """Running, waiting and swapped queue lengths over time."""
    thin = thin_steps(steps, max_points)
    fig = go.Figure()
    for name, column in QUEUE_SERIES:
        fig.add_trace(go.Scatter(x=thin["start_s"], y=thin[column], name=name, mode="lines"))
    return chart_layout(fig, "Scheduler queues", "time (s)", "requests")


def precision_figure(steps: pd.DataFrame, summary: Mapping, *,
                     max_points: int = MAX_POINTS) -> go.Figure | None:
    """A demoting run's share of pages at each precision level and its demotions per second
    over time (plots/precision.py); None for a run without demotion."""
    panels = precision_panels([RunData("", dict(summary), steps=steps)], max_points)
    if not panels:
        return None
    return to_plotly(Figure("precision", "KV precision over time", tuple(panels), columns=2))


def events_figure(steps: pd.DataFrame) -> go.Figure:
    """Preemption and swap events: one marker per step that had any, sized by nothing but
    placed at its count."""
    fig = go.Figure()
    total = 0
    for name, column in EVENT_SERIES:
        hit = steps[steps[column] > 0]
        total += len(hit)
        fig.add_trace(go.Scatter(x=hit["start_s"], y=hit[column], name=name, mode="markers",
                                 marker={"size": 6}))
    fig = chart_layout(fig, "Preemption and swap events", "time (s)", "count in the step")
    if total == 0:  # a message, not an empty plot with made-up axes
        fig.add_annotation(text="no preemption or swap in this run", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5, font={"size": 16})
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
    return fig


def cdf_figure(samples: Mapping[str, np.ndarray], title: str, x_title: str) -> go.Figure:
    """Empirical CDFs, one line per label (NaNs dropped), over a log axis: latencies span
    orders of magnitude, and on a linear axis the fast requests of every series overlap."""
    fig = go.Figure()
    for label, values in samples.items():
        values = np.sort(np.asarray(values, dtype=np.float64))
        values = values[~np.isnan(values)]
        share = np.arange(1, len(values) + 1) / max(len(values), 1)
        fig.add_trace(go.Scatter(x=values, y=share, name=label, mode="lines",
                                 line={"shape": "hv"}))
    fig = chart_layout(fig, title, x_title + " (log scale)", "share of requests")
    fig.update_layout(hovermode="closest", xaxis_type="log")
    return fig


def latency_cdfs(requests: Mapping[str, pd.DataFrame]) -> tuple[go.Figure, go.Figure]:
    """TTFT and TPOT CDFs of completed requests, one line per run label."""
    def done(table: pd.DataFrame, column: str) -> np.ndarray:
        ok = table["status"].isin(["finished_stopped", "finished_length"])
        return table.loc[ok, column].to_numpy()

    ttft = cdf_figure({k: done(t, "ttft_ms") for k, t in requests.items()},
                      "TTFT distribution", "TTFT (ms)")
    tpot = cdf_figure({k: done(t, "tpot_ms") for k, t in requests.items()},
                      "TPOT distribution", "TPOT (ms)")
    return ttft, tpot


def kv_usage_overlay_figure(steps: Mapping[str, pd.DataFrame], num_total_pages: Mapping[str, int],
                            *, max_points: int = MAX_POINTS) -> go.Figure:
    """Used KV pages in percent over time, one line per run label (demoted pages as the
    bytes they fill: `used_pages_in_bytes`)."""
    fig = go.Figure()
    for label, table in steps.items():
        thin = thin_steps(table, max_points)
        used = 100.0 * used_pages_in_bytes(thin) / max(num_total_pages[label], 1)
        fig.add_trace(go.Scatter(x=thin["start_s"], y=used, name=label, mode="lines"))
    return chart_layout(fig, "KV cache usage", "time (s)", "KV memory held (%)")


# Words and units of summary keys (titles and axes; the keys stay in tables and hovers).
_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL", "kv": "KV",
          "perc": "", "ms": ""}
_UNITS = (("_ms", "ms"), ("_perc", "%"), ("output_throughput", "tok/s"),
          ("total_token_throughput", "tok/s"), ("request_throughput", "req/s"),
          ("request_goodput", "req/s"), ("duration", "s"), ("block_size", "tokens"),
          ("request_rate", "req/s"))


def metric_label(key: str) -> str:
    """A summary key as a title: `mean_ttft_ms` -> `mean TTFT (ms)`, `request_goodput` ->
    `request goodput (req/s)`; unknown keys read as words."""
    words = [_WORDS.get(part, part) for part in key.removeprefix("num_").split("_")]
    text = " ".join(word for word in words if word)
    unit = next((unit for suffix, unit in _UNITS if key.endswith(suffix)), None)
    return f"{text} ({unit})" if unit else text


def metric_bar_figure(table: pd.DataFrame, metric: str, label_column: str = "policy") -> go.Figure:
    """One bar per run for one summary metric."""
    fig = go.Figure(go.Bar(x=table[label_column], y=table[metric], name=metric))
    label = metric_label(metric)
    x_title = "run" if label_column == "label" else metric_label(label_column)
    return chart_layout(fig, label, x_title, label)


def class_bar_figure(table: pd.DataFrame, stat: str, label_column: str = "label") -> go.Figure:
    """One group of bars per run, one bar per SLO class, for one per-class metric (the
    table's `classes.<name>.<stat>` columns)."""
    fig = go.Figure()
    for column in table.columns:
        if column.startswith("classes.") and column.endswith("." + stat):
            name = column[len("classes."):-len(stat) - 1]
            fig.add_trace(go.Bar(x=table[label_column], y=table[column], name=name))
    fig.update_layout(barmode="group")
    label = metric_label(stat)
    return chart_layout(fig, f"{label} per SLO class", "run", label)


def page_map_figure(page_map: PageMap, *, max_cells: int = 10_000) -> go.Figure:
    """The pages as a grid of cells coloured by state: free, cached, shared, or the request
    that holds them (colours cycle over request ids; hover names the request).

    With more pages than `max_cells`, each cell stands for a run of consecutive pages and takes
    the state most of them have.
    """
    owners, pages_per_cell = page_map.cells(max_cells)
    num_cells = len(owners)
    width = int(np.ceil(np.sqrt(num_cells * 2)))  # twice as wide as tall
    height = int(np.ceil(num_cells / width))
    padded = np.full(width * height, _NO_PAGE, dtype=np.int64)
    padded[:num_cells] = owners
    code = np.where(padded >= 0, 4 + padded % len(_REQUEST_COLOURS), 0)
    code = np.where(padded == FREE, 1, code)
    code = np.where(padded == CACHED, 2, code)
    code = np.where(padded == SHARED, 3, code)
    labels = np.where(padded >= 0, np.char.add("request ", padded.astype(str)), "")
    for value, text in ((FREE, "free"), (CACHED, "cached prefix"), (SHARED, "shared"),
                        (_NO_PAGE, "(no page)")):
        labels = np.where(padded == value, text, labels)
    first_page = np.arange(width * height) * pages_per_cell
    colours = ("#ffffff", "#cfd8dc", "#1e88e5", "#fb8c00", *_REQUEST_COLOURS)
    scale = [[edge, colour] for i, colour in enumerate(colours)
             for edge in (i / len(colours), (i + 1) / len(colours))]
    fig = go.Figure(go.Heatmap(
        z=code.reshape(height, width), zmin=-0.5, zmax=len(colours) - 0.5,
        colorscale=scale, showscale=False, xgap=1, ygap=1, name="pages",
        customdata=np.stack([first_page, labels], axis=-1).reshape(height, width, 2),
        hovertemplate="page %{customdata[0]}: %{customdata[1]}<extra></extra>",
    ))
    unit = "page" if pages_per_cell == 1 else f"{pages_per_cell} pages"
    fig.update_layout(
        title=f"Page map at step {page_map.step_id} (t={page_map.time_s:.2f} s, "
        f"one cell = {unit})",
        yaxis={"autorange": "reversed", "showticklabels": False, "scaleanchor": "x"},
        xaxis={"showticklabels": False}, margin={"t": 50, "b": 10},
    )
    return fig


def heatmap_figure(grid: pd.DataFrame, x: str, y: str | None, metric: str) -> go.Figure:
    """A sweep grid as a heatmap of `metric` over `x` (and `y`; one row when None)."""
    if y is None:
        pivot = grid.set_index(x)[[metric]].T
        pivot.index = [metric]
    else:
        pivot = grid.pivot_table(index=y, columns=x, values=metric, aggfunc="first")
    fig = go.Figure(go.Heatmap(
        z=pivot.to_numpy(), x=[str(v) for v in pivot.columns], y=[str(v) for v in pivot.index],
        colorscale="Viridis", name=metric, texttemplate="%{z:.3g}",
        colorbar={"title": {"text": metric_label(metric)}},
    ))
    # categories: block sizes 8, 16, 32 or rates 2, 4, 8 are equal cells, not a number line
    fig.update_layout(title=f"{metric_label(metric)} by {metric_label(x)}"
                      + (f" and {metric_label(y)}" if y else ""),
                      xaxis_title=metric_label(x), yaxis_title=metric_label(y) if y else "",
                      margin={"t": 50, "b": 10},
                      xaxis_type="category", yaxis_type="category")
    return fig


def validate_figures(metrics: pd.DataFrame) -> tuple[go.Figure, go.Figure]:
    """Simulator against engine per metric (log-log, with the y=x line), and the relative errors.

    `metrics` has columns metric, sim, engine, rel_error (a fraction).
    """
    positive = metrics[(metrics["sim"] > 0) & (metrics["engine"] > 0)]
    scatter = go.Figure()
    if len(positive):
        low = float(min(positive["sim"].min(), positive["engine"].min()))
        high = float(max(positive["sim"].max(), positive["engine"].max()))
        scatter.add_trace(go.Scatter(x=[low, high], y=[low, high], name="sim = engine",
                                     mode="lines", line={"dash": "dot", "color": "grey"}))
    scatter.add_trace(go.Scatter(x=positive["engine"], y=positive["sim"], name="metrics",
                                 mode="markers+text", text=positive["metric"],
                                 textposition="top center"))
    scatter = chart_layout(scatter, "Simulator against engine", "engine", "simulator")
    scatter.update_layout(xaxis_type="log", yaxis_type="log", hovermode="closest")
    errors = go.Figure(go.Bar(x=metrics["metric"], y=100.0 * metrics["rel_error"],
                              name="relative error"))
    errors = chart_layout(errors, "Relative error of the simulator", "metric", "error (%)")
    return scatter, errors


def trace_names(fig: go.Figure) -> list[str]:
    """The names of a figure's traces, in order (for tests and legends)."""
    return [trace.name for trace in fig.data]


def overlay_labels(labels: Sequence[str]) -> list[str]:
    """Run labels made unique (a repeated policy gets #2, #3)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


TIER_KINDS = ("host", "ssd", "remote")


def tier_figure(table: pd.DataFrame, label_column: str = "kv_tiers") -> go.Figure:
    """Memory tiers compared, one group per configuration: the prompt tokens each level
    served (the device's prefix cache, then each tier, stacked: together the prefix hit rate)
    on the left axis, and the request goodput (or, without SLOs, the output throughput) as a
    line on the right."""
    labels = [str(v) for v in table[label_column]]
    fig = go.Figure()
    device = table["prefix_cache_hit_rate_perc"]  # without tiers every hit is the device's
    if "device_prefix_hit_rate_perc" in table:
        device = table["device_prefix_hit_rate_perc"].fillna(device)
    fig.add_trace(go.Bar(x=labels, y=device, name="device hits (%)"))
    for kind in TIER_KINDS:
        column = f"{kind}_tier_hit_rate_perc"
        if column in table and table[column].notna().any():
            fig.add_trace(go.Bar(x=labels, y=table[column].fillna(0.0), name=f"{kind} hits (%)"))
    rate = "request_goodput" if "request_goodput" in table and \
        table["request_goodput"].notna().any() else "output_throughput"
    fig.add_trace(go.Scatter(x=labels, y=table[rate], name=metric_label(rate), yaxis="y2",
                             mode="lines+markers"))
    fig.update_layout(barmode="stack", yaxis2={"overlaying": "y", "side": "right",
                                               "title": metric_label(rate)},
                      xaxis_type="category")
    return chart_layout(fig, "Prefix hits by memory level, and " + metric_label(rate),
                        "memory tiers", "prompt tokens served from cache (%)")


def instance_bar_figure(instances: pd.DataFrame, metric: str) -> go.Figure:
    """One group of bars per router, one bar per instance in it, for one per-instance summary
    metric (`num_prompts`: the requests routed there)."""
    fig = go.Figure()
    for instance, rows in instances.groupby("instance", sort=True):
        fig.add_trace(go.Bar(x=rows["router"], y=rows[metric], name=f"instance {instance}"))
    fig.update_layout(barmode="group")
    label = "requests routed" if metric == "num_prompts" else metric_label(metric)
    return chart_layout(fig, f"{label} per instance", "router", label)


def instance_load_figure(steps: pd.DataFrame, *, max_points: int = MAX_POINTS) -> go.Figure:
    """Requests running or waiting on each instance over time, one line per instance (a
    cluster's step table: its `instance` column)."""
    fig = go.Figure()
    for instance, rows in steps.groupby("instance", sort=True):
        thin = thin_steps(rows.reset_index(drop=True), max_points)
        fig.add_trace(go.Scatter(x=thin["start_s"], y=thin["num_running"] + thin["num_waiting"],
                                 name=f"instance {instance}", mode="lines"))
    return chart_layout(fig, "Load per instance", "time (s)", "requests running + waiting")
