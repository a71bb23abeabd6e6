"""`kvlab validate --base-url`: the simulator judged against a live server (kvlab serve here;
real vLLM in tests/peer): calibration and validated windows benchmarked in turn, one fit, the
table of simulator vs server, its JSON, and clear errors for what a server run cannot do."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main
from kvlab.engine.config import EngineConfig
from kvlab.policies.serving import ServingConfig
from tests.live_server import start_live_server


@pytest.fixture(scope="module")
def live():
    server = start_live_server(EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4", num_gpu_blocks_override=60, max_model_len=256,
        max_num_batched_tokens=128)))
    yield server
    server.stop()


# 2 windows of 6 validated requests, each after 6 calibration requests; short outputs and
# the Azure excerpt's arrivals 20 times faster keep it to a few seconds
WORKLOAD = ["--dataset-name", "random", "--random-input-len", "48", "--random-output-len",
            "12", "--request-rate", "30", "--num-prompts", "6", "--num-calibration-prompts",
            "6", "--num-windows", "2", "--max-model-len", "256", "--disable-tqdm",
            "--metrics-interval", "0.02"]


def test_validate_against_a_server_reports_sim_vs_server(live, tmp_path, capsys):
    argv = ["validate", "--base-url", live.base_url, *WORKLOAD, "--save-result",
            "--result-dir", str(tmp_path), "--result-filename", "v.json"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Simulator vs server" in out and "Output throughput (tok/s)" in out
    assert "window 2 (6 requests)" in out
    document = json.loads((tmp_path / "v.json").read_text())
    assert document["reference"] == "server"
    assert document["policy"].startswith("paged")  # the policy the simulator ran
    assert len(document["windows"]) == 2
    assert document["server"]["completed"] == document["sim"]["completed"] == 12
    metrics = document["metrics"]
    # the server's KV gauge and its preemption counter reach the table
    assert metrics["num_preemptions"]["server"] is not None
    assert 0 < metrics["mean_kv_usage_perc"]["server"] <= 100
    assert 0 < metrics["peak_kv_usage_perc"]["server"] <= 100


def test_repeats_judge_each_window_on_its_runs_pooled(live, tmp_path, capsys):
    workload = list(WORKLOAD)
    workload[workload.index("--num-windows") + 1] = "1"
    argv = ["validate", "--base-url", live.base_url, *workload, "--num-repeats", "2",
            "--no-refine", "--save-result", "--result-dir", str(tmp_path),
            "--result-filename", "r.json"]  # (the fit is not judged here: its step fit only)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "window 1 (6 requests x 2 runs)" in out
    assert "its step fit only (no refine)" in out
    assert "server's own runs off their pool by up to:" in out
    assert "1% slower steps move these by:" in out
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["server"]["completed"] == document["sim"]["completed"] == 12
    (window,) = document["windows"]
    assert window["num_repeats"] == 2
    assert set(window["speed_sensitivity"]) == {"output_throughput", "mean_ttft_ms",
                                                "mean_tpot_ms"}
    ttft = window["server_repeats"]["mean_ttft_ms"]
    assert len(ttft["values"]) == 2 and ttft["pooled"] == window["metrics"]["mean_ttft_ms"][
        "server"]
    # each run's mean TTFT (same number of requests) strays from the pooled mean by as much
    # as the other, on the other side
    first, second = ttft["values"]
    assert ttft["pooled"] == pytest.approx((first + second) / 2)
    assert ttft["max_rel_deviation"] == pytest.approx(abs(first - second) / (first + second))
    # and of two runs the standard error of their mean is half their difference
    assert ttft["rel_std_error"] == pytest.approx(abs(first - second) / (first + second))
    assert "its pool's standard error:" in out


@pytest.mark.parametrize("extra, message", [
    (["--lockstep"], "--lockstep with --base-url compares the server's KV events: give "
                     "--kv-events"),
    (["--max-concurrency", "0"], "--max-concurrency 0: expected 1 or more"),
    (["--metrics-interval", "0"], "--metrics-interval 0: expected"),
    (["--num-repeats", "0"], "--num-repeats 0: expected 1 or more"),
])
def test_what_a_server_run_cannot_do_is_one_line(live, extra, message, capsys):
    assert main(["validate", "--base-url", live.base_url, *WORKLOAD, *extra]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unreachable_server_is_named(capsys):
    argv = ["validate", "--base-url", "http://127.0.0.1:9", *WORKLOAD]
    assert main(argv) != 0
    assert "127.0.0.1:9" in capsys.readouterr().err


def test_repeats_need_a_server(capsys):
    assert main(["validate", "--num-repeats", "2"]) != 0
    assert "--num-repeats, --until-std-error: only with --base-url" in capsys.readouterr().err


def test_no_refine_needs_a_server(capsys):
    assert main(["validate", "--no-refine"]) != 0
    err = capsys.readouterr().err
    assert "--no-refine: only with --base-url" in err and "Traceback" not in err


def test_rounds_go_on_until_every_windows_pool_is_sure_enough(live, tmp_path, capsys):
    workload = list(WORKLOAD)
    workload[workload.index("--num-windows") + 1] = "1"
    base = ["validate", "--base-url", live.base_url, *workload, "--no-refine", "--save-result",
            "--result-dir", str(tmp_path)]  # (the fit is not judged here: its step fit only)
    # any pool is within 1000%: the rounds (at most 12 by default) stop at the fewest a
    # standard error is judged from
    assert main([*base, "--until-std-error", "1000", "--result-filename", "wide.json"]) == 0
    assert "window 1 (6 requests x 3 runs)" in capsys.readouterr().out
    (window,) = json.loads((tmp_path / "wide.json").read_text())["windows"]
    assert window["num_repeats"] == 3
    # no pool of three runs is within a millionth of a percent: all rounds run, and a warning
    # says the target was not reached and where
    assert main([*base, "--num-repeats", "3", "--until-std-error", "1e-6",
                 "--result-filename", "narrow.json"]) == 0
    out = capsys.readouterr().out
    assert "warning: --until-std-error 1e-06%: not reached in 3 rounds (--num-repeats)" in out
    assert "warning: window 1: its 3 runs leave the server's own means uncertain by" in out


@pytest.mark.parametrize("extra, message", [
    (["--until-std-error", "0"], "--until-std-error 0: expected a percentage > 0"),
    (["--until-std-error", "-5"], "--until-std-error -5: expected a percentage > 0"),
    (["--until-std-error", "5", "--num-repeats", "2"],
     "--num-repeats 2 with --until-std-error: expected 3 or more"),
])
def test_bad_repeat_targets_are_one_line(live, extra, message, capsys):
    assert main(["validate", "--base-url", live.base_url, *WORKLOAD, *extra]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_standard_error_target_needs_a_server(capsys):
    assert main(["validate", "--until-std-error", "5"]) != 0
    assert "--num-repeats, --until-std-error: only with --base-url" in capsys.readouterr().err


def test_a_demoting_kvlab_serve_confirms_the_simulators_demotions(tmp_path, capsys):
    """Against kvlab serve with a precision policy, the pages demoted into each level are
    compared with the server's counters; age-based demotion depends only on each request's
    tokens here (no preemption, no prefix hit), so they are equal; the shares, a gauge's
    busy scrapes against the simulator's steps, are compared too."""
    server = start_live_server(EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4,precision=age:recent=8,depth=2", num_gpu_blocks_override=60,
        max_model_len=256, max_num_batched_tokens=128)))
    try:
        argv = ["validate", "--base-url", server.base_url, *WORKLOAD, "--save-result",
                "--result-dir", str(tmp_path), "--result-filename", "p.json"]
        assert main(argv) == 0
    finally:
        server.stop()
    metrics = json.loads((tmp_path / "p.json").read_text())["metrics"]
    for key in ("precision_demotions_1_fp8_e4m3", "precision_demotions_2_int4_per_token_head"):
        assert metrics[key]["sim"] == metrics[key]["server"] > 0, key
    assert metrics["precision_demotions_per_s"]["server"] > 0
    # measured 0.200 / 0.202 (auto) and 0.653 / 0.652 (int4), sim / server, on 2026-12-07
    for key in ("precision_share_0_auto", "precision_share_2_int4_per_token_head"):
        assert metrics[key]["server"] == pytest.approx(metrics[key]["sim"], abs=0.05), key
    assert "Pages demoted to fp8_e4m3" in capsys.readouterr().out
