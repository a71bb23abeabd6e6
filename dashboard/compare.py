"""Compare page: two to six policies on the same workload, one table, overlaid charts, and the
best policy under the user's SLO (goodput as vLLM defines it)."""

from __future__ import annotations

import streamlit as st

from kvlab.dashboard import figures
from kvlab.dashboard.runs import best_run, summary_table
from kvlab.dashboard.widgets import cached_run, chart, current_setup, table, user_errors
from kvlab.errors import KvlabError
from kvlab.policies import parse_policy

SUBMITTED = "compare_submitted"
DEFAULT_POLICIES = "contiguous:reserve=max\npaged\nbuddy:block_sizing=geometric"
TABLE_COLUMNS = ("label", "request_goodput", "request_throughput", "output_throughput",
                 "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "num_preemptions",
                 "num_swaps_out", "mean_kv_usage_perc", "kv_token_state_perc",
                 "internal_fragmentation_perc", "external_fragmentation_perc", "completed",
                 "failed")


def parse_policies(text: str) -> list[str]:
    """Canonical spec strings of one policy per line (2 to 6); KvlabError names the bad line."""
    specs = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                specs.append(parse_policy(line.strip()).to_string())
            except KvlabError as err:
                raise KvlabError(f"line {number} of the policies: {err}") from None
    if not 2 <= len(specs) <= 6:
        raise KvlabError(f"{len(specs)} policies given; compare takes 2 to 6, one per line")
    return specs


def main() -> None:
    """Render the Compare page."""
    st.title("kvlab · Compare policies")
    setup = current_setup()
    text = st.text_area("Policies, one spec per line (2 to 6)", DEFAULT_POLICIES,
                        key="compare_policies", help="e.g. paged:block_size=32,eviction=lru")
    st.markdown("**SLO** (a request is good when it meets every limit; 0: no limit)")
    cols = st.columns(3)
    slos = {name: cols[i].number_input(f"{name.upper()} ≤ (ms)", 0.0, 1e7, default,
                                       key=f"slo_{name}_ms")
            for i, (name, default) in enumerate((("ttft", 500.0), ("tpot", 50.0),
                                                 ("e2el", 0.0)))}
    clicked = st.button("Run", key="compare_run", type="primary")
    with user_errors():
        specs = parse_policies(text)
    slo_items = tuple((k, float(v)) for k, v in slos.items() if v > 0)
    if clicked:
        st.session_state[SUBMITTED] = (setup, tuple(specs), slo_items)
    if SUBMITTED not in st.session_state:
        st.info("Press **Run** to simulate every policy on the workload in the sidebar.")
        return
    run_setup, run_specs, run_slos = st.session_state[SUBMITTED]
    if (run_setup, run_specs, run_slos) != (setup, tuple(specs), slo_items):
        st.warning("Stale: these results are of the previous inputs. Press **Run** to "
                   "simulate the ones set now.", icon=":material/history:")
    views = []
    progress = st.progress(0.0, text="simulating")
    with user_errors():
        for index, spec in enumerate(run_specs):
            views.append(cached_run(run_setup.key(), spec, run_slos, run_setup))
            progress.progress((index + 1) / len(run_specs), text=f"simulated {spec}")
    progress.empty()
    labels = figures.overlay_labels(list(run_specs))
    results(views, labels, dict(run_slos))


def results(views: list, labels: list[str], slos: dict[str, float]) -> None:
    """The comparison table, the best policy under the SLO, and the overlaid charts."""
    frame = summary_table(views, labels)
    best = best_run(frame)
    if not slos:
        st.warning("No SLO set: goodput is not computed.")
    elif best is None:
        st.warning("No policy met the SLO for any request.")
    else:
        row = frame.set_index("label").loc[best]
        st.success(f"Best under the SLO: `{best}`, {row['request_goodput']:.2f} good requests/s "
                   f"of {row['request_throughput']:.2f} completed/s.")
    shown = [c for c in TABLE_COLUMNS if c in frame]
    table(frame[shown], "compare_table")
    with st.expander("Every summary key"):
        table(frame, "compare_full_table")
    steps = {label: view.steps for label, view in zip(labels, views, strict=True)}
    pages = {label: int(view.summary["num_total_pages"])
             for label, view in zip(labels, views, strict=True)}
    chart(figures.kv_usage_overlay_figure(steps, pages), "compare_kv_usage")
    ttft, tpot = figures.latency_cdfs(
        {label: view.requests for label, view in zip(labels, views, strict=True)})
    left, right = st.columns(2)
    with left:
        chart(ttft, "compare_ttft_cdf")
    with right:
        chart(tpot, "compare_tpot_cdf")
    metric = "request_goodput" if slos else "request_throughput"
    chart(figures.metric_bar_figure(frame, metric, "label"), "compare_bar")
    if any(column.endswith(".goodput_perc") for column in frame):  # a workload with classes
        chart(figures.class_bar_figure(frame, "goodput_perc"), "compare_class_goodput")


if __name__ == "__main__":
    main()
