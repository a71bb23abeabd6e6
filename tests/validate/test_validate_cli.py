"""`kvlab validate` and `kvlab calibrate` end to end, and `kvlab sim --cost-model`."""

from __future__ import annotations

import json
import math

import pytest

from kvlab.cli import main
from kvlab.fidelity import METRICS
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig, simulate
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.traces import load_trace

SMALL = [
    "--dataset-name", "random", "--random-input-len", "24", "--random-output-len", "6",
    "--num-prompts", "4", "--num-gpu-blocks-override", "16", "--block-size", "4",
    "--max-model-len", "64", "--disable-tqdm",
]


def test_validate_saves_every_metric_with_finite_values(tmp_path, capsys):
    code = main(["validate", *SMALL, "--lockstep", "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "v.json"])
    assert code == 0
    saved = json.loads((tmp_path / "v.json").read_text())
    assert saved["lockstep_identical"] is True
    assert sorted(saved["metrics"]) == sorted(key for _, key in METRICS)
    for name, row in saved["metrics"].items():
        for column in ("sim", "engine", "rel_error"):
            assert isinstance(row[column], float) and math.isfinite(row[column]), (name, column)
    assert saved["calibration"].startswith("separate run")
    assert "Output throughput (tok/s)" in capsys.readouterr().out


def test_validate_compares_the_precision_mix_of_a_demoting_policy(tmp_path, capsys):
    """With a precision policy the table adds each level's share and demotions, and the
    demotions per second; in lockstep the simulator demotes the engine's pages exactly."""
    code = main(["validate", *SMALL, "--policy",
                 "paged:block_size=4,precision=age:recent=8,depth=2", "--lockstep",
                 "--save-result", "--result-dir", str(tmp_path), "--result-filename", "p.json"])
    assert code == 0
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["lockstep_identical"] is True
    levels = ("0_auto", "1_fp8_e4m3", "2_int4_per_token_head")
    shares = [saved["metrics"][f"precision_share_{level}"] for level in levels]
    assert sum(row["engine"] for row in shares) == pytest.approx(1.0)
    for level in levels[1:]:
        row = saved["metrics"][f"precision_demotions_{level}"]
        assert row["sim"] == row["engine"] > 0 and row["rel_error"] == 0.0
    assert "precision_demotions_per_s" in saved["metrics"]
    out = capsys.readouterr().out
    assert "Pages demoted to int4_per_token_head" in out and "Share at fp8_e4m3" in out


def test_calibrate_fits_a_run_profile_that_sim_then_uses(tmp_path, capsys):
    assert main(["run", *SMALL, "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", "r.json"]) == 0
    model_path = tmp_path / "cm.json"
    assert main(["calibrate", str(tmp_path / "r.steps.csv"), "-o", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "decode_token (us):" in out and "R^2:" in out
    assert main(["sim", *SMALL[:6], "--num-prompts", "4", "--num-gpu-blocks-override", "16",
                 "--cost-model", str(model_path), "--save-result", "--result-dir",
                 str(tmp_path), "--result-filename", "s.json", "--disable-tqdm"]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["cost_model"] == str(model_path)


def test_a_simulation_named_cost_model_times_steps_with_it(tmp_path):
    model = CalibratedCostModel(step_overhead_s=0.5, decode_token_s=0.25)
    path = model.save(tmp_path / "cm.json")
    trace = load_trace("random", num_prompts=1, random_input_len=8, random_output_len=3)
    config = SimConfig(cost_model=str(path), serving=ServingConfig(num_gpu_blocks_override=64))
    result = simulate(trace, config)
    durations = list(result.steps.columns["duration_s"])
    assert durations[1:] == [0.75, 0.75]  # decode steps: overhead + one decode token


def test_a_missing_cost_model_file_is_a_user_error(tmp_path, capsys):
    assert main(["sim", "--cost-model", str(tmp_path / "none.json")]) == 2
    assert "--cost-model" in capsys.readouterr().err


def test_windows_are_validated_one_by_one_and_pooled(tmp_path, capsys):
    code = main(["validate", *SMALL, "--num-prompts", "3", "--num-windows", "2",
                 "--num-calibration-prompts", "4", "--lockstep", "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "w.json"])
    assert code == 0
    saved = json.loads((tmp_path / "w.json").read_text())
    assert saved["lockstep_identical"] is True
    assert saved["engine"]["completed"] == 6
    windows = saved["windows"]
    assert [w["num_prompts"] for w in windows] == [3, 3]
    assert all(w["lockstep_identical"] and "calibration window" in w["calibration"]
               for w in windows)
    # The pooled engine throughput lies between the windows' own.
    rates = [w["metrics"]["output_throughput"]["engine"] for w in windows]
    assert min(rates) <= saved["metrics"]["output_throughput"]["engine"] <= max(rates)
    out = capsys.readouterr().out
    assert "window 1 (3 requests)" in out and "window 2 (3 requests)" in out


@pytest.mark.filterwarnings("ignore:.*holds only 600 requests")
def test_too_short_a_trace_for_the_windows_is_a_user_error(capsys):
    code = main(["validate", "--dataset-name", "mooncake", "--num-prompts", "200",
                 "--num-windows", "2", "--disable-tqdm"])
    assert code == 2
    err = capsys.readouterr().err
    assert "600 requests" in err and "1600" in err
