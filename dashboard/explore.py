"""Explore page: one policy on one workload, its headline metrics, memory, queues, latencies
and page map."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kvlab.dashboard import figures
from kvlab.dashboard.runs import HEADLINE, RunView
from kvlab.dashboard.widgets import (
    cached_page_map,
    cached_run,
    chart,
    current_setup,
    policy_editor,
    table,
    user_errors,
)
from kvlab.dashboard.workload import Setup

SUBMITTED = "explore_submitted"
MAP_CELLS = 10_000


def main() -> None:
    """Render the Explore page."""
    st.title("kvlab · Explore a policy")
    setup = current_setup()
    spec = policy_editor("explore")
    clicked = st.button("Run", key="explore_run", type="primary")
    inputs = (setup, spec.to_string())
    if clicked or SUBMITTED not in st.session_state:
        st.session_state[SUBMITTED] = inputs
    submitted = st.session_state[SUBMITTED]
    if submitted != inputs:  # say loudly that what is shown is not what is set
        st.warning("Stale: these results are of the previous inputs. Press **Run** to "
                   "simulate the ones set now.", icon=":material/history:")
    run_setup, policy = submitted
    with user_errors():
        view = cached_run(run_setup.key(), policy, (), run_setup)
    headline(view)
    charts(view)
    slo_classes(view)
    page_map(view, run_setup, policy)
    with st.expander("Tables"):
        summary = {k: v for k, v in view.summary.items() if not isinstance(v, (dict, list))}
        table(_summary_frame(summary), "explore_summary")
        table(view.requests, "explore_requests", height=240)
        table(view.steps, "explore_steps", height=240)


def headline(view: RunView) -> None:
    """The run's key numbers as metric tiles, and what was simulated."""
    s = view.summary
    st.caption(f"`{s['policy']}` · {s['model']} on {s['hardware']} · {s['dataset']}, "
               f"{s['completed']} completed / {s['failed']} failed · KV cache "
               f"{s['num_total_pages']:,} pages of {s['page_size']} tokens")
    cols = st.columns(len(HEADLINE) // 2)
    for index, (key, label, fmt) in enumerate(HEADLINE):
        cols[index % len(cols)].metric(label, fmt.format(s[key]))


def charts(view: RunView) -> None:
    """Memory, queues, events and latency distributions."""
    page_size = int(view.summary["page_size"])
    chart(figures.kv_memory_figure(view.steps, page_size), "explore_kv_memory")
    left, right = st.columns(2)
    with left:
        chart(figures.queue_figure(view.steps), "explore_queues")
    with right:
        chart(figures.events_figure(view.steps), "explore_events")
    precision = figures.precision_figure(view.steps, view.summary)
    if precision is not None:  # (a precision policy demoted pages)
        chart(precision, "explore_precision_mix")
    ttft, tpot = figures.latency_cdfs({str(view.summary["policy"]): view.requests})
    left, right = st.columns(2)
    with left:
        chart(ttft, "explore_ttft_cdf")
    with right:
        chart(tpot, "explore_tpot_cdf")


def slo_classes(view: RunView) -> None:
    """Each SLO class's metrics, its goodput share and P99 TTFT as bars, Jain's fairness and
    the priority inversions (nothing for a workload without classes)."""
    summary = view.summary
    classes = summary.get("classes")
    if not classes:
        return
    st.subheader("SLO classes")
    frame = pd.DataFrame([{"class": name, **stats} for name, stats in classes.items()])
    fairness = summary.get("fairness_jain")
    st.caption(f"Scheduling policy `{summary.get('scheduling_policy') or 'fcfs'}` · Jain's "
               "fairness over the classes' SLO attainment: "
               + ("n/a (fewer than two classes with SLOs)" if fairness is None
                  else f"{fairness:.3f}")
               + f" · priority inversions: {summary.get('num_priority_inversions', 0):,}")
    left, right = st.columns(2)
    with left:
        if "goodput_perc" in frame:
            chart(figures.metric_bar_figure(frame, "goodput_perc", "class"),
                  "explore_class_goodput")
    with right:
        chart(figures.metric_bar_figure(frame, "p99_ttft_ms", "class"), "explore_class_ttft")
    table(frame, "explore_classes")


def page_map(view: RunView, setup: Setup, policy: str) -> None:
    """Pages by state at a chosen step, on demand (it replays the simulation to that step)."""
    st.subheader("Page map")
    steps = view.steps
    if not st.toggle("Show the page map", key="map_show",
                     help="replays the simulation up to the chosen step: takes up to a run"):
        return
    peak = int(steps["num_used_pages"].to_numpy().argmax()) if len(steps) else 0
    index = st.slider("Step", 0, max(len(steps) - 1, 1), peak, key="map_step",
                      help="default: the step with the most pages in use")
    row = steps.iloc[min(index, len(steps) - 1)]
    with user_errors():
        pages = cached_page_map(setup.key(), policy, int(row["step_id"]),
                                float(row["start_s"]), float(row["duration_s"]), setup)
    num_pages = len(pages.owners)
    note = "" if num_pages <= MAP_CELLS else (
        f" {num_pages:,} pages are shown as {MAP_CELLS:,} cells or fewer: each cell takes the "
        "state most of its pages have.")
    st.caption(f"Re-simulated up to step {pages.step_id}: {pages.num_used_pages:,} pages used, "
               f"{pages.num_cached_pages:,} cached, of {num_pages:,}. Colours cycle over "
               f"request ids; hover a cell for its request.{note}")
    chart(figures.page_map_figure(pages, max_cells=MAP_CELLS), "explore_page_map")


def _summary_frame(summary: dict) -> pd.DataFrame:
    return pd.DataFrame({"metric": list(summary), "value": [str(v) for v in summary.values()]})


if __name__ == "__main__":
    main()
