"""Figure builders: pure functions of result tables, tested without Streamlit."""

import numpy as np
import pandas as pd
import pytest
from dashboard_cases import small_view, step_table
from hypothesis import given
from hypothesis import strategies as st

from kvlab.dashboard import figures
from kvlab.dashboard.live_figures import live_figures
from kvlab.dashboard.pagemap import CACHED, FREE, SHARED, PageMap


def test_kv_memory_layers_stack_to_the_whole_cache():
    view = small_view()
    page_size = int(view.summary["page_size"])
    fig = figures.kv_memory_figure(view.steps, page_size)
    assert figures.trace_names(fig) == [name for name, _ in figures.KV_LAYERS]
    total = sum(np.asarray(trace.y, dtype=float) for trace in fig.data)
    np.testing.assert_allclose(total, view.summary["num_total_pages"] * page_size)


def test_kv_memory_counts_cached_and_free_pages_in_tokens():
    steps = step_table(num_cached_free_pages=[1, 2, 3], num_free_pages=[4, 4, 4])
    fig = figures.kv_memory_figure(steps, page_size=16)
    by_name = {trace.name: list(trace.y) for trace in fig.data}
    assert by_name["cached prefix pages"] == [16, 32, 48]
    assert by_name["free"] == [64, 64, 64]


@given(st.integers(1, 5000), st.integers(1, 400))
def test_thinning_keeps_the_time_average(num_steps, max_points):
    values = np.arange(num_steps, dtype=float)
    thin = figures.thin_steps(pd.DataFrame({"v": values}), max_points)
    assert len(thin) <= max(max_points, 1) or len(thin) == num_steps
    if len(thin) == num_steps:
        assert thin["v"].tolist() == values.tolist()
    assert thin["v"].min() >= 0 and thin["v"].max() <= num_steps - 1


def test_queue_figure_has_running_waiting_and_swapped():
    fig = figures.queue_figure(small_view().steps)
    assert figures.trace_names(fig) == ["running", "waiting", "swapped"]


def test_events_figure_marks_only_steps_with_events():
    steps = step_table(num_preempted=[0, 2, 0], num_swap_out_pages=[0, 5, 0],
                       num_swap_in_pages=[0, 0, 5])
    fig = figures.events_figure(steps)
    points = {trace.name: (list(trace.x), list(trace.y)) for trace in fig.data}
    assert points == {"preemptions": ([1.0], [2]), "pages swapped out": ([1.0], [5]),
                      "pages swapped in": ([2.0], [5])}


def test_events_figure_says_so_when_nothing_happened():
    fig = figures.events_figure(step_table())
    assert "no preemption" in fig.layout.annotations[0].text
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False  # no -1..4


def test_cdf_rises_to_one_and_drops_nans():
    fig = figures.cdf_figure({"a": np.array([3.0, np.nan, 1.0, 2.0])}, "t", "x")
    assert list(fig.data[0].x) == [1.0, 2.0, 3.0]
    assert list(fig.data[0].y) == [1 / 3, 2 / 3, 1.0]
    assert fig.layout.xaxis.type == "log"  # series of different speeds stay apart


def test_latency_cdfs_cover_completed_requests_only():
    requests = small_view().requests
    ttft, tpot = figures.latency_cdfs({"run": requests})
    completed = requests["status"].isin(["finished_stopped", "finished_length"]).sum()
    assert len(ttft.data[0].x) == completed < len(requests)
    assert figures.trace_names(tpot) == ["run"]


def test_overlay_has_one_line_per_run_in_percent():
    steps = step_table(num_used_pages=[0, 5, 10])
    fig = figures.kv_usage_overlay_figure({"a": steps, "b": steps}, {"a": 10, "b": 20})
    assert figures.trace_names(fig) == ["a", "b"]
    assert list(fig.data[0].y) == [0, 50, 100] and list(fig.data[1].y) == [0, 25, 50]


def test_page_map_colours_each_state_and_names_the_request():
    owners = np.array([FREE, CACHED, SHARED, 7, 7, 12])
    fig = figures.page_map_figure(PageMap(3, 1.5, 16, owners))
    heat = fig.data[0]
    labels = [cell[1] for row in heat.customdata for cell in row][:6]
    assert labels == ["free", "cached prefix", "shared", "request 7", "request 7", "request 12"]
    codes = [c for row in heat.z for c in row][:6]
    assert len(set(codes[:3])) == 3 and codes[3] == codes[4] != codes[5]


def test_page_map_groups_pages_into_cells_by_majority():
    owners = np.array([FREE, 4, 4, 4, FREE, FREE, CACHED, CACHED])
    cells, per_cell = PageMap(0, 0.0, 16, owners).cells(max_cells=2)
    assert per_cell == 4 and cells.tolist() == [4, FREE]
    fig = figures.page_map_figure(PageMap(0, 0.0, 16, owners), max_cells=2)
    assert "one cell = 4 pages" in fig.layout.title.text


def test_heatmap_pivots_two_parameters():
    grid = pd.DataFrame({"block_size": [8, 16, 8, 16], "request_rate": [1, 1, 2, 2],
                         "m": [1.0, 2.0, 3.0, 4.0]})
    fig = figures.heatmap_figure(grid, "block_size", "request_rate", "m")
    assert fig.data[0].z.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert list(fig.data[0].x) == ["8", "16"] and list(fig.data[0].y) == ["1", "2"]
    # equal cells: the axes are categories, not numbers 8..16 with a wide and a narrow cell
    assert fig.layout.xaxis.type == "category" and fig.layout.yaxis.type == "category"


def test_heatmap_of_one_parameter_is_one_row():
    grid = pd.DataFrame({"block_size": [8, 16], "m": [1.0, 2.0]})
    fig = figures.heatmap_figure(grid, "block_size", None, "m")
    assert fig.data[0].z.tolist() == [[1.0, 2.0]]


def test_validate_figures_plot_sim_against_engine_and_errors():
    metrics = pd.DataFrame({"metric": ["a", "b"], "sim": [1.0, 2.0], "engine": [1.1, 2.0],
                            "rel_error": [-0.09, 0.0]})
    scatter, errors = figures.validate_figures(metrics)
    assert figures.trace_names(scatter) == ["sim = engine", "metrics"]
    assert list(scatter.data[1].x) == [1.1, 2.0] and list(scatter.data[1].y) == [1.0, 2.0]
    assert list(errors.data[0].y) == [-9.0, 0.0]


def test_overlay_labels_number_repeated_policies():
    assert figures.overlay_labels(["paged", "buddy", "paged"]) == ["paged", "buddy", "paged #2"]


def test_live_charts_turn_counters_into_rates_between_scrapes():
    from kvlab.bench import MetricsSample

    def sample(time_s, usage, running, preemptions, queries, hits):
        return MetricsSample(time_s, {
            "vllm:kv_cache_usage_perc": usage, "vllm:num_requests_running": running,
            "vllm:num_preemptions_total": preemptions,
            "vllm:prefix_cache_queries_total": queries, "vllm:prefix_cache_hits_total": hits,
        })

    samples = [sample(10.0, 0.5, 2, 1, 100, 10), sample(12.0, 0.75, 3, 5, 300, 110)]
    usage, queues, rates, hits = live_figures(samples)
    assert list(usage.data[0].y) == [50.0, 75.0] and list(usage.data[0].x) == [0.0, 2.0]
    assert figures.trace_names(queues) == ["running"]  # only the series the server exports
    assert list(rates.data[0].y) == [2.0] and list(rates.data[0].x) == [1.0]
    assert list(hits.data[0].y) == [50.0]


def test_live_charts_a_demoting_servers_demotions_per_second():
    """kvlab serve with a precision policy exports its demotions (server/metrics.py); the
    scrape sums them over levels."""
    from kvlab.bench import MetricsSample

    samples = [MetricsSample(t, {"kvlab:kv_page_demotions_total": n,
                                 "vllm:num_preemptions_total": 0.0})
               for t, n in ((0.0, 0.0), (4.0, 40.0), (6.0, 50.0))]
    rates = live_figures(samples)[2]
    assert figures.trace_names(rates) == ["preemptions", "pages demoted"]
    assert list(rates.data[1].y) == [10.0, 5.0]


def test_live_charts_a_demoting_servers_precision_mix():
    """A fifth chart, the share of pages at each dtype, where the server exports the mix; the
    four others alone where it does not."""
    from kvlab.bench import MetricsSample

    def sample(time_s, auto, fp8):
        # (level 1 listed first: the chart orders the levels)
        return MetricsSample(time_s, {
            'kvlab:kv_pages_at_precision{level="1",dtype="fp8_e4m3"}': fp8,
            'kvlab:kv_pages_at_precision{level="0",dtype="auto"}': auto})

    charts = live_figures([sample(0.0, 4.0, 0.0), sample(2.0, 1.0, 3.0),
                                   sample(4.0, 0.0, 0.0)])
    mix = charts[4]
    assert figures.trace_names(mix) == ["auto (model dtype)", "fp8_e4m3"]
    assert list(mix.data[0].y) == [100.0, 25.0, None] and list(mix.data[1].y) == [0.0, 75.0, None]
    assert len(live_figures([MetricsSample(0.0, {})])) == 4


@pytest.mark.parametrize("key, label", [
    ("mean_ttft_ms", "mean TTFT (ms)"), ("request_goodput", "request goodput (req/s)"),
    ("output_throughput", "output throughput (tok/s)"), ("p99_itl_ms", "p99 ITL (ms)"),
    ("prefix_cache_hit_rate_perc", "prefix cache hit rate (%)"),
    ("num_preemptions", "preemptions"), ("block_size", "block size (tokens)"),
])
def test_titles_and_axes_say_what_and_in_which_unit(key, label):
    assert figures.metric_label(key) == label


def test_a_bar_chart_titles_its_metric_in_words():
    table = pd.DataFrame({"label": ["a", "b"], "request_goodput": [1.0, 2.0]})
    fig = figures.metric_bar_figure(table, "request_goodput", "label")
    assert fig.layout.title.text == "request goodput (req/s)"
    assert fig.layout.xaxis.title.text == "run"


def test_tier_figure_stacks_each_levels_hits_under_the_goodput_line():
    import pandas as pd

    from kvlab.dashboard.figures import tier_figure

    table = pd.DataFrame({
        "kv_tiers": ["none", "host:64GiB"],
        "prefix_cache_hit_rate_perc": [2.0, 9.0],
        "device_prefix_hit_rate_perc": [None, 2.5],
        "host_tier_hit_rate_perc": [None, 6.5],
        "request_goodput": [0.5, 0.7],
    })
    fig = tier_figure(table)
    assert [trace.name for trace in fig.data] == ["device hits (%)", "host hits (%)",
                                                  "request goodput (req/s)"]
    assert list(fig.data[0].y) == [2.0, 2.5] and list(fig.data[1].y) == [0.0, 6.5]
    assert fig.layout.barmode == "stack"
