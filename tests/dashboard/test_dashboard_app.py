"""The app driven by Streamlit's AppTest, widget by widget key: no exceptions, expected series."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvlab.dashboard.widgets import LOCAL_PATH, SETUP_STATE
from tests.bench.metrics_server import VLLM_METRICS, serve_text

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
WIDGETS = ("button", "checkbox", "multiselect", "number_input", "radio", "selectbox", "slider",
           "text_area", "text_input", "toggle")


def series(at: AppTest) -> list[list[str]]:
    """The trace names of every Plotly chart on the page, chart by chart."""
    return [[trace.get("name") for trace in json.loads(chart.proto.spec)["data"]]
            for chart in at.get("plotly_chart")]


def checked(at: AppTest) -> AppTest:
    """The app after a run that raised nothing and showed no error."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


@pytest.fixture
def app() -> AppTest:
    """The app on a small workload (100 requests), Explore page shown."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["num_prompts"] = 100
    return checked(at.run())


def test_explore_is_the_first_page_and_draws_every_chart(app):
    assert app.title[0].value.endswith("Explore a policy")
    assert series(app) == [
        ["real tokens", "internal fragmentation", "cached prefix pages", "free"],
        ["running", "waiting", "swapped"],
        ["preemptions", "pages swapped out", "pages swapped in"],
        ["paged"], ["paged"],
    ]
    assert {m.label for m in app.metric} >= {"requests/s", "mean TTFT (ms)", "preemptions"}


def test_run_simulates_the_edited_policy(app):
    app.selectbox(key="explore_kind").set_value("buddy")
    app.selectbox(key="explore_block_sizing").set_value("geometric")
    checked(app.run())
    assert series(app)[3] == ["paged"]  # nothing reruns the simulation before Run
    checked(app.button(key="explore_run").click().run())
    assert series(app)[3] == ["buddy:block_sizing=geometric"]


def test_a_precision_policy_charts_its_mix_over_time(app):
    app.text_input(key="explore_precision").set_value("age:recent=32,depth=2")
    checked(app.button(key="explore_run").click().run())
    assert series(app)[3] == ["auto (model dtype)", "fp8_e4m3", "int4_per_token_head",
                              "pages demoted"]
    assert series(app)[4] == ["paged:precision=age:recent=32,depth=2"]  # (the TTFT CDF)


def test_a_bad_precision_policy_is_an_error_on_the_page(app):
    app.text_input(key="explore_precision").set_value("age:recent=0")
    app.button(key="explore_run").click().run()
    assert not app.exception
    assert "recent must be >= 1" in app.error[0].value


def test_the_page_map_draws_the_pages(app):
    checked(app.toggle(key="map_show").set_value(True).run())
    assert series(app)[-1] == ["pages"]
    assert "Re-simulated up to step" in app.caption[-1].value


def test_a_bad_trace_file_shows_its_problem_without_a_traceback(app, tmp_path):
    bad = tmp_path / "mine.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,many,3\n")
    app.selectbox(key="trace").set_value(LOCAL_PATH).run()
    app.text_input(key="trace_path").set_value(str(bad)).run()
    app.button(key="explore_run").click().run()
    assert not app.exception
    assert "mine.csv" in app.error[0].value and "ContextTokens" in app.error[0].value


def test_every_widget_has_a_key(app):
    for page in (None, "compare.py", "sweep.py", "tiers.py", "routers.py", "validate.py",
                 "live.py"):
        if page:
            app.switch_page(page).run()
        for kind in WIDGETS:
            for widget in getattr(app, kind):
                assert widget.key, f"{kind} {widget.label!r} on {page or 'explore'} has no key"


def test_compare_names_the_best_policy_and_overlays_the_runs(app):
    app.switch_page("compare.py").run()
    app.text_area(key="compare_policies").set_value("paged\npaged:block_size=64\nbuddy")
    checked(app.button(key="compare_run").click().run())
    assert "Best under the SLO" in app.success[0].value
    names = ["paged", "paged:block_size=64", "buddy"]
    assert series(app) == [names, names, names, ["request_goodput"]]


def test_compare_shows_a_bad_policy_line_as_an_error(app):
    app.switch_page("compare.py").run()
    app.text_area(key="compare_policies").set_value("paged\npaged:eviction=sometimes")
    app.run()
    assert not app.exception
    assert "line 2 of the policies" in app.error[0].value


def test_sweep_draws_a_heatmap_of_the_chosen_metric(app):
    app.number_input(key="num_prompts").set_value(30)
    app.switch_page("sweep.py").run()
    app.text_input(key="sweep_x_values_block_size").set_value("8,32")
    app.selectbox(key="sweep_y").set_value("max_num_seqs").run()
    app.text_input(key="sweep_y_values_max_num_seqs").set_value("8")
    checked(app.button(key="sweep_run").click().run())
    assert series(app) == [["request_throughput"]]
    checked(app.selectbox(key="sweep_metric").set_value("mean_ttft_ms").run())
    assert series(app) == [["mean_ttft_ms"]]


def test_sweep_charts_a_kvlab_sweep_folder_with_the_other_parameters_fixed(app, tmp_path):
    from dashboard_cases import small_sweep_folder

    folder = small_sweep_folder(tmp_path / "rows", policy=["paged", "buddy"],
                                max_num_seqs=[4, 64], eviction=["none", "lru"])
    app.switch_page("sweep.py").run()
    app.radio(key="sweep_source").set_value("read a kvlab sweep folder").run()
    checked(app.text_input(key="sweep_folder").set_value(str(folder)).run())
    assert app.selectbox(key="sweep_folder_x").value == "policy"
    assert app.selectbox(key="sweep_folder_y").value == "max_num_seqs"
    assert app.selectbox(key="sweep_folder_fix_eviction").options == ["lru", "none"]
    assert series(app) == [["request_throughput"]]
    checked(app.selectbox(key="sweep_folder_fix_eviction").set_value("lru").run())
    assert "8 rows, 0 failed" in app.caption[0].value


def test_validate_overlays_simulator_and_engine(app, tmp_path):
    result = tmp_path / "validate.json"
    result.write_text(json.dumps({"metrics": {
        "mean_ttft_ms": {"sim": 90.0, "engine": 100.0, "rel_error": -0.1},
        "output_throughput": {"sim": 1000.0, "engine": 990.0, "rel_error": 0.0101},
        "num_preemptions": {"sim": 1.0, "engine": 0.0, "rel_error": None},
    }, "lockstep_identical": True, "engine": {"duration": 9.0}, "sim": {"duration": 9.5}}))
    app.switch_page("validate.py").run()
    checked(app.text_input(key="validate_path").set_value(str(result)).run())
    assert series(app) == [["sim = engine", "metrics"], ["relative error"]]
    assert "Lockstep" in app.success[0].value
    assert app.metric[0].value == "-10.0%"


def test_validate_shows_a_bad_file_as_an_error(app, tmp_path):
    result = tmp_path / "validate.json"
    result.write_text('{"metrics": {"x": {"sim": 1}}}')
    app.switch_page("validate.py").run()
    app.text_input(key="validate_path").set_value(str(result)).run()
    assert not app.exception
    assert "metrics.x.engine is None" in app.error[0].value


def test_live_scrapes_a_metrics_page_and_charts_it(app):
    url, stop = serve_text(lambda: VLLM_METRICS)
    try:
        app.switch_page("live.py").run()
        app.text_input(key="live_url").set_value(url)
        checked(app.run())
        checked(app.run())  # a second scrape: rates between the two
    finally:
        stop()
    assert app.title[0].value.endswith("Live server")
    assert series(app) == [["KV cache usage"], ["running", "waiting"], ["preemptions"],
                           ["prefix-cache hit rate"]]
    assert "5 running, 7 waiting, KV cache 25.0% used" in app.caption[-1].value


def test_live_charts_a_demoting_servers_precision_mix(app):
    mix = ('kvlab:kv_pages_at_precision{dtype="auto",level="0",model_name="m"} 3.0\n'
           'kvlab:kv_pages_at_precision{dtype="fp8_e4m3",level="1",model_name="m"} 1.0\n')
    url, stop = serve_text(lambda: VLLM_METRICS + mix)
    try:
        app.switch_page("live.py").run()
        app.text_input(key="live_url").set_value(url)
        checked(app.run())
    finally:
        stop()
    assert series(app)[-1] == ["auto (model dtype)", "fp8_e4m3"]


def test_live_shows_an_unreachable_server_as_an_error(app):
    app.switch_page("live.py").run()
    app.text_input(key="live_url").set_value("http://127.0.0.1:1/metrics").run()
    assert "cannot read http://127.0.0.1:1/metrics" in app.error[0].value
    assert not app.exception


def test_max_model_len_reaches_the_setup(app):
    checked(app.number_input(key="max_model_len").set_value(512).run())
    assert app.session_state[SETUP_STATE].serving.max_model_len == 512
    checked(app.number_input(key="max_model_len").set_value(0).run())
    assert app.session_state[SETUP_STATE].serving.max_model_len is None  # the model's


def test_the_kv_cache_size_reaches_the_setup(app):
    checked(app.number_input(key="kv_cache_mib").set_value(2048).run())
    assert app.session_state[SETUP_STATE].serving.kv_cache_memory_bytes == 2 * 2**30
    checked(app.number_input(key="kv_cache_mib").set_value(0).run())
    assert app.session_state[SETUP_STATE].serving.kv_cache_memory_bytes is None  # utilisation


def test_the_full_prompt_admission_gate_reaches_the_setup(app):
    # on by default, as vLLM V1 and the library have it
    assert app.session_state[SETUP_STATE].serving.scheduler_reserve_full_isl is True
    checked(app.checkbox(key="reserve_full_isl").uncheck().run())
    assert app.session_state[SETUP_STATE].serving.scheduler_reserve_full_isl is False


def test_validate_says_how_to_make_its_json(app):
    checked(app.switch_page("validate.py").run())
    assert "kvlab validate --save-result" in app.code[0].value
    assert "--base-url" in app.code[0].value


def test_results_of_changed_inputs_are_marked_stale_until_run(app):
    assert not app.warning
    checked(app.number_input(key="max_num_seqs").set_value(8).run())
    assert "Stale" in app.warning[0].value
    checked(app.button(key="explore_run").click().run())
    assert not app.warning


def test_tiers_stacks_the_hits_of_each_memory_level(app):
    app.selectbox(key="trace").set_value("mooncake")
    app.selectbox(key="model").set_value("llama-3.1-8b")
    app.selectbox(key="hardware").set_value("h200-141g")
    app.session_state["num_prompts"] = 200
    app.switch_page("tiers.py").run()
    app.text_input(key="tiers_values").set_value("none,host:64GiB,host:16GiB+ssd:256GiB")
    checked(app.button(key="tiers_run").click().run())
    assert series(app) == [["device hits (%)", "host hits (%)", "ssd hits (%)",
                            "request goodput (req/s)"]]
    rows = app.dataframe[0].value
    assert list(rows["kv_tiers"]) == ["none", "host:64GiB", "host:16GiB+ssd:256GiB"]
    assert rows["prefix_cache_hit_rate_perc"].iloc[1] > rows["prefix_cache_hit_rate_perc"].iloc[0]


def test_tiers_shows_a_bad_configuration_as_an_error(app):
    app.switch_page("tiers.py").run()
    app.text_input(key="tiers_values").set_value("host:64GiB,disk:1TiB")
    app.button(key="tiers_run").click().run()
    assert not app.exception
    assert "tier kind 'disk'" in app.error[0].value


def test_routers_compares_each_router_on_the_cluster(app):
    app.switch_page("routers.py").run()
    app.number_input(key="routers_num_instances").set_value(3)
    app.multiselect(key="routers_chosen").set_value(["round-robin", "prefix-aware"])
    checked(app.button(key="routers_run").click().run())
    instances = ["instance 0", "instance 1", "instance 2"]
    assert series(app) == [["prefix_cache_hit_rate_perc"], ["mean_ttft_ms"], instances,
                           instances, instances]
    assert app.dataframe[0].value["router"].tolist() == ["round-robin", "prefix-aware"]


def test_routers_shows_a_bad_policy_as_an_error(app):
    app.switch_page("routers.py").run()
    app.text_input(key="routers_policy").set_value("paged:eviction=sometimes").run()
    assert not app.exception
    assert app.error[0].value.startswith("policy:")


def test_the_scheduling_policy_reaches_the_setup_and_classes_show(app):
    assert app.session_state[SETUP_STATE].serving.scheduling_policy == "fcfs"
    checked(app.selectbox(key="scheduling_policy").set_value("priority").run())
    assert app.session_state[SETUP_STATE].serving.scheduling_policy == "priority"
    spec = Path(__file__).resolve().parents[2] / "docs/experiments/scheduling/two-class.yaml"
    app.selectbox(key="trace").set_value(LOCAL_PATH).run()
    checked(app.text_input(key="trace_path").set_value(str(spec)).run())
    checked(app.button(key="explore_run").click().run())
    assert ["goodput_perc"] in series(app) and ["p99_ttft_ms"] in series(app)
    assert any("Jain's fairness" in caption.value for caption in app.caption)


def test_compare_draws_each_class_goodput_for_a_workload_with_classes(app):
    spec = Path(__file__).resolve().parents[2] / "docs/experiments/scheduling/two-class.yaml"
    app.selectbox(key="trace").set_value(LOCAL_PATH).run()
    checked(app.text_input(key="trace_path").set_value(str(spec)).run())
    app.switch_page("compare.py").run()
    app.text_area(key="compare_policies").set_value("paged\npaged:eviction=lru")
    checked(app.button(key="compare_run").click().run())
    assert series(app)[-1] == ["batch", "chat"]
