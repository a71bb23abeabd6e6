"""A cost model says where it came from (issue 15 #6): `kvlab sim --cost-model` names it in the
report and warns when it was fitted for another model or fitted poorly; `kvlab calibrate` warns
on a poor fit and records the profiled model."""

from __future__ import annotations

import json

from kvlab.cli import main
from kvlab.fidelity.calibration import fit_warnings, mismatch_warning
from kvlab.sim.calibrated import CalibratedCostModel, load_cost_model

SIM = ["sim", "--model", "tiny-llama", "--num-prompts", "4", "--max-model-len", "2048",
       "--disable-tqdm"]


def _save(tmp_path, **fit):
    path = tmp_path / "cm.json"
    model = CalibratedCostModel(step_overhead_s=0.001, decode_token_s=1e-5, fit=fit)
    path.write_text(json.dumps(model.to_json()))
    return path


def test_sim_names_the_cost_model_and_warns_of_another_models_fit(tmp_path, capsys):
    path = _save(tmp_path, model="llama-3.1-8b", r2=0.37, mape_perc=372.0)
    assert main([*SIM, "--cost-model", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"Cost model:                              {path}" in captured.out
    assert "was fitted on llama-3.1-8b; simulating tiny-llama" in captured.err
    assert "R^2 0.37" in captured.err and "MAPE 372%" in captured.err


def test_a_good_fit_for_the_same_model_is_silent(tmp_path, capsys):
    path = _save(tmp_path, model="tiny-llama", r2=0.97, mape_perc=4.0)
    assert main([*SIM, "--cost-model", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_warnings_follow_the_fit():
    model = CalibratedCostModel(fit={"r2": 0.9, "mape_perc": 10.0})
    assert fit_warnings(model) == []
    assert mismatch_warning(model, "tiny-llama", "x") is None  # no model recorded: no claim
    poor = CalibratedCostModel(fit={"r2": 0.2, "mape_perc": 80.0})
    assert len(fit_warnings(poor)) == 2


def test_calibrate_records_the_profiled_model_and_warns_on_noise(tmp_path, capsys, monkeypatch):
    import numpy as np
    import pandas as pd

    from kvlab.metrics.records import STEP_COLUMNS

    rng = np.random.default_rng(0)
    rows = {column: np.zeros(40, dtype=np.int64) for column in STEP_COLUMNS}
    rows["step_id"] = np.arange(40)
    rows["num_seqs"] = rng.integers(1, 8, 40)
    rows["num_decode_tokens"] = rows["num_seqs"]
    rows["num_context_tokens"] = rng.integers(10, 500, 40)
    for column in ("start_s", "duration_s", "wall_time_s"):
        rows[column] = rng.uniform(0.001, 0.1, 40)  # times unrelated to the work: noise
    profile = tmp_path / "run.steps.csv"
    pd.DataFrame(rows).to_csv(profile, index=False)
    (tmp_path / "run.json").write_text(json.dumps({"model": "tiny-llama"}))
    out = tmp_path / "cm.json"
    assert main(["calibrate", str(profile), "-o", str(out)]) == 0
    assert "warning: poor fit" in capsys.readouterr().err
    assert load_cost_model(out).fit["model"] == "tiny-llama"
    monkeypatch.chdir(tmp_path)  # without -o: cost_model.json here
    assert main(["calibrate", str(profile)]) == 0
    assert load_cost_model(tmp_path / "cost_model.json").fit["model"] == "tiny-llama"
