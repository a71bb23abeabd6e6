"""The page map replays a run to one step and agrees with that step's record."""

import pytest
from dashboard_cases import SMALL, small_setup, small_view

from kvlab.dashboard.pagemap import CACHED, FREE, SHARED, page_map_at
from kvlab.dashboard.runs import run_view
from kvlab.dashboard.workload import load_setup_trace
from kvlab.traces import Trace, TraceRequest


@pytest.mark.parametrize("position", [0.1, 0.5, 0.9])
def test_page_map_matches_the_step_record(position):
    view = small_view()
    row = view.steps.iloc[int(position * (len(view.steps) - 1))]
    pages = page_map_at(load_setup_trace(SMALL), SMALL.config(view.summary["policy"]),
                        int(row["step_id"]), float(row["start_s"]), float(row["duration_s"]))
    assert pages.num_used_pages == row["num_used_pages"]
    assert pages.num_cached_pages == row["num_cached_free_pages"]
    assert int((pages.owners == FREE).sum()) == row["num_free_pages"]


def test_page_map_shows_cached_and_shared_prefix_pages():
    setup = small_setup(trace="mooncake", gpu_memory_utilization=0.9, time_scale=1.0)
    policy = "paged:eviction=lru"
    view = run_view(load_setup_trace(setup), setup, policy)
    steps = view.steps
    row = steps.loc[steps["num_cached_free_pages"].idxmax()]
    pages = page_map_at(load_setup_trace(setup), setup.config(policy), int(row["step_id"]),
                        float(row["start_s"]), float(row["duration_s"]))
    assert pages.num_cached_pages == row["num_cached_free_pages"] > 0
    assert (pages.owners == CACHED).any()
    assert pages.num_used_pages == row["num_used_pages"]


def test_page_map_marks_prefix_pages_two_running_requests_share():
    prefix = (11, 12)  # two 512-token prompt blocks both requests start with
    trace = Trace("two", "mooncake", "synthetic", [
        TraceRequest(0, 0.0, 1024, 400, hash_ids=prefix),
        TraceRequest(1, 1.0, 1024, 400, hash_ids=prefix),
    ])
    setup = small_setup(gpu_memory_utilization=0.9)
    config = setup.config("paged:eviction=lru")
    view = run_view(trace, setup, "paged:eviction=lru")
    both = view.steps[view.steps["num_running"] == 2].iloc[-1]
    pages = page_map_at(trace, config, int(both["step_id"]), float(both["start_s"]),
                        float(both["duration_s"]))
    # 1023 of 1024 prompt tokens can hit: 63 full pages of 16 tokens are shared
    assert int((pages.owners == SHARED).sum()) == 63
    assert {0, 1} <= set(pages.owners.tolist())
    assert pages.num_used_pages == both["num_used_pages"]
