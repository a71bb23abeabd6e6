"""Runs as tables, the best policy under an SLO, sweeps over a grid, validate results."""

import json
import math

import pandas as pd
import pytest
from dashboard_cases import SMALL, small_setup, small_sweep_folder

from kvlab.dashboard.compare import parse_policies
from kvlab.dashboard.runs import (
    SWEEP_PARAMETERS,
    best_run,
    load_validate_result,
    parse_values,
    run_view,
    summaries_side_by_side,
    summary_table,
    sweep,
)
from kvlab.dashboard.workload import load_setup_trace
from kvlab.errors import KvlabError
from kvlab.policies import PolicySpec
from kvlab.sweep.settings import SETTINGS


def test_goodput_is_in_the_summary_when_an_slo_is_given():
    view = run_view(load_setup_trace(SMALL), SMALL, "paged", {"ttft": 1e9})
    assert view.summary["request_goodput"] == view.summary["request_throughput"]


def test_the_best_run_has_the_highest_goodput():
    table = pd.DataFrame({"label": ["a", "b", "c"], "request_goodput": [1.0, 3.0, 3.0]})
    assert best_run(table) == "b"


def test_no_best_run_when_no_request_met_the_slo():
    assert best_run(pd.DataFrame({"label": ["a"], "request_goodput": [0.0]})) is None
    assert best_run(pd.DataFrame({"label": ["a"], "request_throughput": [1.0]})) is None


def test_summary_table_has_one_row_per_labelled_run():
    view = run_view(load_setup_trace(SMALL), SMALL, "paged")
    table = summary_table([view, view], ["x", "y"])
    assert table["label"].tolist() == ["x", "y"]
    assert "policy_json" not in table  # nested values stay out of the table


def test_a_sweep_runs_every_grid_point_in_order_with_progress():
    calls = []
    setup = small_setup(num_prompts=20)
    grid = sweep(setup, PolicySpec(), "block_size", [8, 32], "max_num_seqs", [4, 64],
                 on_point=lambda done, total: calls.append((done, total)))
    assert grid[["block_size", "max_num_seqs"]].values.tolist() == [[8, 4], [32, 4], [8, 64],
                                                                    [32, 64]]
    assert grid["page_size"].tolist() == [8, 32, 8, 32]
    assert grid["max_num_seqs"].tolist() == [4, 4, 64, 64]
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_sweep_values_are_parsed_for_their_parameter():
    assert parse_values("block_size", "8, 16,32") == [8, 16, 32]
    assert parse_values("request_rate", "0.5,2") == [0.5, 2.0]
    assert parse_values("kv_tier_block_size", "none,256,auto") == [None, 256, "auto"]


def test_the_sweep_pages_parameters_are_settings_of_the_one_table():
    assert set(SWEEP_PARAMETERS) <= set(SETTINGS)


def test_a_sweep_over_tier_page_sizes_runs_each():
    setup = small_setup(num_prompts=20)
    values = parse_values("kv_tier_block_size", "none,auto")
    grid = sweep(setup, PolicySpec(eviction="lru"), "kv_tier_block_size", values, "kv_tiers",
                 ["host:4GiB"])
    assert grid["error"].isna().all(), grid["error"].tolist()
    assert grid["kv_tier_block_size"].isna().tolist() == [True, False]  # (none: one page)
    assert (grid["host_tier_pages"] > 0).all()


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("block_size", "8,sixteen", "'sixteen': expected a whole number"),
    ("kv_tier_block_size", "auto,big", "'big': expected a number of tokens, auto or none"),
    ("block_size", " , ", "at least one"),
    ("colour", "1", "cannot sweep 'colour'"),
])
def test_bad_sweep_values_are_named(name, text, problem):
    with pytest.raises(KvlabError, match=problem):
        parse_values(name, text)


def test_compare_takes_two_to_six_policies_one_per_line():
    assert parse_policies("paged\n\nbuddy:block_sizing=geometric\n") == [
        "paged", "buddy:block_sizing=geometric"]
    with pytest.raises(KvlabError, match="1 policies given"):
        parse_policies("paged")
    with pytest.raises(KvlabError, match="line 2 of the policies"):
        parse_policies("paged\npaged:eviction=sometimes")


def validate_json(**metrics) -> bytes:
    return json.dumps({"metrics": metrics, "lockstep_identical": True}).encode()


def test_a_validate_result_becomes_a_metrics_table():
    data = validate_json(mean_ttft_ms={"sim": 9.0, "engine": 10.0, "rel_error": -0.1})
    table, info = load_validate_result("v.json", data)
    assert table.to_dict("records") == [
        {"metric": "mean_ttft_ms", "sim": 9.0, "engine": 10.0, "rel_error": -0.1}]
    assert info == {"lockstep_identical": True}


def test_an_undefined_relative_error_is_kept_as_nan():
    data = validate_json(num_preemptions={"sim": 2, "engine": 0, "rel_error": None})
    table, _ = load_validate_result("v.json", data)
    assert table["sim"].tolist() == [2.0] and math.isnan(table["rel_error"][0])


def test_both_summaries_line_up_key_by_key():
    info = {"engine": {"duration": 2.0, "policy": "paged", "completed": 5},
            "sim": {"duration": 2.5, "completed": 5}}
    both = summaries_side_by_side(info)
    assert both.to_dict("records") == [
        {"metric": "duration", "engine": 2.0, "sim": 2.5},
        {"metric": "completed", "engine": 5, "sim": 5}]
    assert summaries_side_by_side({"lockstep_identical": None}) is None


@pytest.mark.parametrize(("data", "problem"), [
    (b"{not json", "v.json is not a JSON file"),
    (b'{"lockstep_identical": true}', "expected a kvlab validate result"),
    (validate_json(x={"sim": "fast", "engine": 1, "rel_error": 0}), "metrics.x.sim is 'fast'"),
    (validate_json(x=3), "metrics.x is 3"),
    (validate_json(), "empty"),
])
def test_a_bad_validate_result_names_the_problem(data, problem):
    with pytest.raises(KvlabError, match=problem):
        load_validate_result("v.json", data)


def test_a_sweep_over_policy_choices_runs_each_policy():
    setup = small_setup(num_prompts=20)
    values = parse_values("preemption", "recompute, swap")
    grid = sweep(setup, PolicySpec(), "preemption", values, "eviction", ["none", "lru"])
    assert grid[["preemption", "eviction"]].values.tolist() == [
        ["recompute", "none"], ["swap", "none"], ["recompute", "lru"], ["swap", "lru"]]
    with pytest.raises(KvlabError, match="eviction='sometimes'; valid:"):
        sweep(setup, PolicySpec(), "eviction", ["sometimes"], None, [])


def test_a_sweep_over_precision_policies_keeps_their_commas_and_runs_each():
    setup = small_setup(num_prompts=20)
    values = parse_values("precision", "none,age:recent=16,depth=2")
    assert values == ["none", "age:recent=16,depth=2"]
    grid = sweep(setup, PolicySpec(eviction="lru"), "precision", values, None, [])
    assert grid["precision"].tolist() == values
    assert grid["error"].isna().all(), grid["error"].tolist()
    demotions = grid["precision_demotions_per_s"].tolist()
    assert pd.isna(demotions[0]) and demotions[1] > 0  # the swept policy demoted


def test_a_sweep_folder_loads_with_the_parameters_it_varies_as_axes(tmp_path):
    from kvlab.dashboard.runs import load_sweep_folder

    folder = small_sweep_folder(tmp_path / "rows", policy=["paged", "buddy"],
                                max_num_seqs=[4, 64], seed=[0])
    frame, axes = load_sweep_folder(str(folder))
    assert axes == ["policy", "max_num_seqs"]  # seed and the base settings do not vary
    assert sorted(frame["policy"]) == ["buddy", "buddy", "paged", "paged"]
    assert len(frame) == 4 and "param.policy" not in frame


def test_a_folder_that_is_not_a_sweep_is_named(tmp_path):
    from kvlab.dashboard.runs import load_sweep_folder

    with pytest.raises(KvlabError, match="no such folder"):
        load_sweep_folder(str(tmp_path / "missing"))
    with pytest.raises(KvlabError, match="no sweep rows"):
        load_sweep_folder(str(tmp_path))
