"""The Routers page's tables and figures: one row per router and per instance, bars grouped
by router, a load line per instance."""

import pandas as pd
import pytest
from dashboard_cases import small_setup

from kvlab.dashboard import figures
from kvlab.dashboard.cluster_runs import cluster_view, instance_table, router_table
from kvlab.dashboard.workload import load_setup_trace
from kvlab.errors import KvlabError

SETUP = small_setup(num_prompts=60)


@pytest.fixture(scope="module")
def views():
    trace = load_setup_trace(SETUP)
    return [cluster_view(trace, SETUP, "paged:eviction=lru", 3, router)
            for router in ("round-robin", "least-loaded")]


def test_the_router_table_has_one_row_per_router_with_its_imbalance(views):
    frame = router_table(views)
    assert frame["router"].tolist() == ["round-robin", "least-loaded"]
    assert frame["load_imbalance"].iloc[0] == pytest.approx(1.0)  # 60 requests, 20 each
    assert (frame["load_imbalance"] >= 1.0).all()
    assert frame["completed"].tolist() == [v.summary["completed"] for v in views]


def test_the_instance_table_has_every_router_s_instances(views):
    frame = instance_table(views)
    assert frame[["router", "instance"]].values.tolist() == [
        [router, i] for router in ("round-robin", "least-loaded") for i in range(3)]
    assert frame.groupby("router")["num_prompts"].sum().tolist() == [60, 60]


def test_instance_bars_are_grouped_by_router_one_series_per_instance(views):
    fig = figures.instance_bar_figure(instance_table(views), "num_prompts")
    assert figures.trace_names(fig) == ["instance 0", "instance 1", "instance 2"]
    assert list(fig.data[0].x) == ["round-robin", "least-loaded"]
    assert fig.layout.title.text == "requests routed per instance"


def test_the_load_figure_draws_running_plus_waiting_per_instance():
    steps = pd.DataFrame({"instance": [0, 0, 1], "start_s": [0.0, 1.0, 0.5],
                          "num_running": [2, 3, 1], "num_waiting": [1, 0, 4]})
    fig = figures.instance_load_figure(steps)
    assert figures.trace_names(fig) == ["instance 0", "instance 1"]
    assert list(fig.data[0].y) == [3, 3] and list(fig.data[1].y) == [5]


def test_an_instance_count_out_of_range_is_named():
    with pytest.raises(KvlabError, match="instances: 0"):
        cluster_view(load_setup_trace(SETUP), SETUP, "paged", 0, "round-robin")
