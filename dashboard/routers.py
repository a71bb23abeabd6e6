"""Routers page: one policy on a cluster of N instances of the sidebar's machine, under each
chosen router: the routers side by side (prefix hit rate, throughput, TTFT), the requests
and prefix hits of every instance, and one router's load per instance over time."""

from __future__ import annotations

import streamlit as st

from kvlab.dashboard import figures
from kvlab.dashboard.cluster_runs import MAX_INSTANCES, instance_table, router_table
from kvlab.dashboard.setting_widgets import number_setting
from kvlab.dashboard.widgets import cached_cluster, chart, current_setup, table, user_errors
from kvlab.errors import KvlabError
from kvlab.policies import parse_policy
from kvlab.sim import router_names

SUBMITTED = "routers_submitted"
# Prefix caching on: what a prefix-aware router looks at.
DEFAULT_POLICY = "paged:eviction=lru"


def main() -> None:
    """Render the Routers page."""
    st.title("kvlab · Routers on a cluster")
    setup = current_setup()
    cols = st.columns([3, 1, 1])
    text = cols[0].text_input("Policy of every instance", DEFAULT_POLICY, key="routers_policy",
                              help="eviction none turns the prefix cache off, and with it "
                              "what prefix-aware routing looks at")
    num_instances = int(number_setting(cols[1], "num_instances", 1, MAX_INSTANCES,
                                       key="routers_num_instances", label="Instances",
                                       default=4))
    seed = int(number_setting(cols[2], "router_seed", 0, 2**31 - 1, key="routers_seed",
                              label="Router seed"))
    names = router_names()
    chosen = st.multiselect("Routers", names, names, key="routers_chosen")
    clicked = st.button("Run", key="routers_run", type="primary")
    with user_errors():
        try:
            policy = parse_policy(text.strip()).to_string()
        except KvlabError as err:
            raise KvlabError(f"policy: {err}") from None
        if not chosen:
            raise KvlabError("choose at least one router")
    inputs = (setup, policy, num_instances, seed, tuple(chosen))
    if clicked:
        st.session_state[SUBMITTED] = inputs
    if SUBMITTED not in st.session_state:
        st.info("Press **Run** to simulate the workload in the sidebar on the cluster, once "
                "per router.")
        return
    run_inputs = st.session_state[SUBMITTED]
    if run_inputs != inputs:
        st.warning("Stale: these results are of the previous inputs. Press **Run** to "
                   "simulate the ones set now.", icon=":material/history:")
    run_setup, run_policy, run_instances, run_seed, run_routers = run_inputs
    views = []
    progress = st.progress(0.0, text="simulating")
    with user_errors():
        for index, router in enumerate(run_routers):
            views.append(cached_cluster(run_setup.key(), run_policy, run_instances, router,
                                        run_seed, run_setup))
            progress.progress((index + 1) / len(run_routers), text=f"simulated {router}")
    progress.empty()
    results(views)


def results(views: list) -> None:
    """The router table, the per-router and per-instance bars, one router's load over time."""
    frame = router_table(views)
    table(frame, "routers_table")
    left, right = st.columns(2)
    with left:
        chart(figures.metric_bar_figure(frame, "prefix_cache_hit_rate_perc", "router"),
              "routers_hit_rate")
    with right:
        chart(figures.metric_bar_figure(frame, "mean_ttft_ms", "router"), "routers_ttft")
    instances = instance_table(views)
    left, right = st.columns(2)
    with left:
        chart(figures.instance_bar_figure(instances, "num_prompts"), "routers_instance_load")
    with right:
        chart(figures.instance_bar_figure(instances, "prefix_cache_hit_rate_perc"),
              "routers_instance_hit_rate")
    with st.expander("Every instance's summary"):
        table(instances, "routers_instances_table")
    by_router = {view.router: view for view in views}
    shown = st.selectbox("Load over time of", list(by_router), key="routers_load_of")
    chart(figures.instance_load_figure(by_router[shown].steps), "routers_load")


if __name__ == "__main__":
    main()
