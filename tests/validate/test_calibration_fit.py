"""The cost-model fit: non-negative least squares, known coefficients recovered, the model file."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.fidelity.calibration import (
    fit_cost_model,
    fit_quality,
    format_fit,
    load_profiles,
    nnls,
    robust_step_fit,
)
from kvlab.fidelity.from_bench import bent_step_fit
from kvlab.metrics import STEP_COLUMNS
from kvlab.sim.calibrated import CalibratedCostModel, load_cost_model
from kvlab.sim.cost_model import StepShape

TRUE = CalibratedCostModel(
    step_overhead_s=2e-3,
    prefill_token_s=5e-5,
    decode_token_s=3e-4,
    context_token_s=1e-6,
    attention_pair_s=5e-9,
    seq_s=1e-4,
    padded_context_token_s=1e-7,
    swap_transfer_s=2e-4,
    swap_page_s=3e-5,
    copy_page_s=1e-5,
)


def synthetic_profile(model: CalibratedCostModel, num_steps: int = 400, seed: int = 0,
                      noise: float = 0.0) -> pd.DataFrame:
    """Steps of random shapes timed by `model`, one in ten swapping or copying pages."""
    rng = np.random.default_rng(seed)
    prefill = rng.integers(0, 512, num_steps) * (rng.random(num_steps) < 0.3)
    decode = rng.integers(1, 32, num_steps)
    seqs = decode + (prefill > 0)
    rows = {name: np.zeros(num_steps, dtype=np.int64) for name in STEP_COLUMNS}
    mean_context = rng.integers(16, 1024, num_steps)
    # its own stream, so that the other columns are drawn as before it existed
    spread = np.random.default_rng([seed, 1]).integers(0, 1024, num_steps)
    longest_context = mean_context + spread * (decode > 1)
    rows.update(
        num_prefill_tokens=prefill,
        num_decode_tokens=decode,
        num_seqs=seqs,
        num_context_tokens=decode * mean_context + prefill,
        num_attention_pairs=prefill * (prefill + 1) // 2,
        num_padded_context_tokens=decode * longest_context,
    )
    swapping = rng.random(num_steps) < 0.1
    rows["num_swap_out_pages"] = swapping * rng.integers(1, 40, num_steps)
    rows["num_swap_out_transfers"] = np.minimum(rows["num_swap_out_pages"],
                                                swapping * rng.integers(1, 5, num_steps))
    rows["num_copied_pages"] = swapping * rng.integers(0, 3, num_steps)
    frame = pd.DataFrame(rows)
    shapes = [StepShape(*(int(frame.at[i, name]) for name in (
        "num_prefill_tokens", "num_decode_tokens", "num_context_tokens", "num_seqs",
        "num_attention_pairs", "num_padded_context_tokens"))) for i in range(num_steps)]
    times = np.array([
        model.step_time_s(shape)
        + model.swap_time_s(int(frame.at[i, "num_swap_out_pages"]),
                            int(frame.at[i, "num_swap_out_transfers"]))
        + model.copy_time_s(int(frame.at[i, "num_copied_pages"]))
        for i, shape in enumerate(shapes)
    ])
    times *= 1.0 + noise * rng.standard_normal(num_steps)
    frame["wall_time_s"] = times
    frame["duration_s"] = times
    return frame


def test_the_fit_recovers_known_coefficients_from_an_exact_profile():
    fitted = fit_cost_model(synthetic_profile(TRUE))
    for name, value in TRUE.coefficients().items():
        assert fitted.coefficients()[name] == pytest.approx(value, rel=1e-6), name
    assert fitted.fit["r2"] == pytest.approx(1.0)
    assert fitted.fit["mape_perc"] == pytest.approx(0.0, abs=1e-6)


def test_the_fit_stays_close_under_step_time_noise():
    fitted = fit_cost_model(synthetic_profile(TRUE, num_steps=4000, noise=0.05))
    for name in ("step_overhead_s", "prefill_token_s", "context_token_s",
                 "padded_context_token_s", "swap_page_s"):
        assert fitted.coefficients()[name] == pytest.approx(TRUE.coefficients()[name], rel=0.1)
    # A decode is one token of one sequence: only the sum of the two costs is identifiable.
    assert fitted.decode_token_s + fitted.seq_s == pytest.approx(
        TRUE.decode_token_s + TRUE.seq_s, rel=0.1
    )
    assert abs(fitted.fit["total_error_perc"]) < 1.0


def test_a_cost_that_only_adds_noise_is_clamped_to_zero_not_negative():
    model = CalibratedCostModel(step_overhead_s=1e-3, decode_token_s=1e-4)
    profile = synthetic_profile(model, num_steps=2000, noise=0.02)
    fitted = fit_cost_model(profile)
    assert all(value >= 0.0 for value in fitted.coefficients().values())
    assert fitted.decode_token_s == pytest.approx(1e-4, rel=0.1)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_nnls_is_non_negative_and_no_worse_than_clipping_lstsq(seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((20, 5))
    b = rng.standard_normal(20)
    x = nnls(a, b)
    assert (x >= 0).all()
    clipped = np.clip(np.linalg.lstsq(a, b, rcond=None)[0], 0.0, None)
    assert np.linalg.norm(a @ x - b) <= np.linalg.norm(a @ clipped - b) + 1e-9


def test_nnls_solves_a_problem_with_a_non_negative_exact_solution():
    rng = np.random.default_rng(1)
    a = rng.random((30, 4))
    x = np.array([0.5, 0.0, 2.0, 1.5])
    np.testing.assert_allclose(nnls(a, a @ x), x, atol=1e-10)


def test_the_model_file_round_trips(tmp_path):
    fitted = fit_cost_model(synthetic_profile(TRUE), sources=["a.steps.csv"])
    path = fitted.save(tmp_path / "cm.json")
    loaded = load_cost_model(path)
    assert loaded == fitted
    assert loaded.fit["sources"] == ["a.steps.csv"]


def test_a_file_that_is_not_a_cost_model_is_a_user_error(tmp_path):
    path = tmp_path / "cm.json"
    path.write_text(json.dumps({"duration": 1.0}))
    with pytest.raises(KvlabError, match="not a calibrated cost model"):
        load_cost_model(path)


def test_a_cost_model_file_of_another_format_version_is_refused_with_the_fix(tmp_path):
    data = CalibratedCostModel().to_json()
    data["version"] = 1
    del data["coefficients"]["padded_context_token_s"]
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(data))
    with pytest.raises(KvlabError, match=r"version 1.*kvlab calibrate"):
        load_cost_model(path)


def test_a_negative_coefficient_in_the_file_is_a_user_error(tmp_path):
    data = CalibratedCostModel().to_json()
    data["coefficients"]["seq_s"] = -1.0
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(data))
    with pytest.raises(KvlabError, match=r"seq_s is -1\.0"):
        load_cost_model(path)


def test_a_profile_missing_columns_names_them(tmp_path):
    path = tmp_path / "x.steps.csv"
    pd.DataFrame({"wall_time_s": [0.1]}).to_csv(path, index=False)
    with pytest.raises(KvlabError, match="num_prefill_tokens"):
        load_profiles([path])


def test_profiles_from_several_files_are_fitted_together(tmp_path):
    paths = []
    for seed in (1, 2):
        path = tmp_path / f"r{seed}.steps.csv"
        synthetic_profile(TRUE, num_steps=200, seed=seed).to_csv(path, index=False)
        paths.append(path)
    profile = load_profiles(paths)
    fitted = fit_cost_model(profile, skip_first_steps=1)
    assert fitted.fit["num_steps"] == 398
    assert fit_quality(fitted, profile).r2 == pytest.approx(1.0)


BENT = dataclasses.replace(TRUE, swap_transfer_s=0.0, swap_page_s=0.0, copy_page_s=0.0,
                           first_decode_token_s=4e-4, first_decodes=8.0)
STEP_TERMS = ("step_overhead_s", "prefill_token_s", "decode_token_s", "context_token_s",
              "attention_pair_s", "seq_s", "padded_context_token_s")


def test_the_bent_decode_term_is_recovered_at_its_knee():
    profile = synthetic_profile(BENT)
    fitted = robust_step_fit(profile, STEP_TERMS, first_decodes=8)
    assert fitted.first_decodes == 8.0
    assert fitted.first_decode_token_s == pytest.approx(4e-4, rel=1e-6)
    assert fitted.decode_token_s == pytest.approx(3e-4, rel=1e-6)


@pytest.mark.parametrize("model, knee", [
    (BENT, 8.0),
    (dataclasses.replace(BENT, first_decodes=16.0), 16.0),
    (dataclasses.replace(BENT, first_decode_token_s=0.0), 0.0),
    # a bend this slight (6% less step error at its knee) is not worth a term
    (dataclasses.replace(BENT, first_decode_token_s=4e-5), 0.0),
])
def test_stage_one_picks_the_knee_the_steps_bend_at_or_none(model, knee):
    profile = synthetic_profile(model, noise=0.02)
    fitted = bent_step_fit(profile, STEP_TERMS)
    assert fitted.first_decodes == knee
    assert (fitted.first_decode_token_s > 0) == (knee > 0)


def test_a_bent_model_round_trips_and_a_straight_one_writes_no_bent_term(tmp_path):
    bent = dataclasses.replace(BENT, fit={"num_steps": 1, "num_memory_steps": 0, "r2": 1.0,
                                          "mape_perc": 0.0, "total_error_perc": 0.0})
    assert load_cost_model(bent.save(tmp_path / "bent.json")) == bent
    assert "for this many decodes of a step:" in format_fit(bent)
    straight = dataclasses.replace(bent, first_decode_token_s=0.0, first_decodes=0.0)
    written = json.loads(straight.save(tmp_path / "line.json").read_text())
    assert "first_decode_token_s" not in written["coefficients"]
    assert "first_decodes" not in written["coefficients"]
    assert "first_decode" not in format_fit(straight)


@pytest.mark.parametrize("inside_s, negative", [(0.004, False), (-0.008, True)])
def test_the_report_says_where_the_latency_inside_the_server_came_from(inside_s, negative):
    fit = {"num_steps": 1, "num_memory_steps": 0, "r2": 1.0, "mape_perc": 0.0,
           "total_error_perc": 0.0, "in_server_latency_s": inside_s,
           "in_server_latency_from": "server histograms"}
    text = format_fit(CalibratedCostModel(api_latency_s=0.01, fit=fit))
    line = next(row for row in text.splitlines() if "inside the server" in row)
    assert f"{inside_s * 1e6:.4f}" in line and "(from its server histograms" in line
    assert ("negative: the simulator waits longer" in line) == negative


def test_the_fit_recovers_what_demoted_reads_cost_from_a_profile_that_saved_context():
    # Steps of a precision policy: the context its demoted pages spare is charged apart
    # (`demoted_context_token_s`), the context left as context, as the simulator charges them
    true = dataclasses.replace(TRUE, demoted_context_token_s=4e-6, requantize_page_s=3e-4)
    frame = synthetic_profile(true)
    rng = np.random.default_rng(7)
    context = frame["num_context_tokens"].to_numpy()
    saved = np.floor(context * rng.random(len(frame)) * (rng.random(len(frame)) < 0.6)) / 4
    requantized = rng.integers(0, 24, len(frame)) * (rng.random(len(frame)) < 0.3) * 0.625
    frame["num_saved_context_tokens"] = saved
    frame["num_requantized_pages"] = requantized
    columns = ("num_prefill_tokens", "num_decode_tokens", "num_context_tokens", "num_seqs",
               "num_attention_pairs", "num_padded_context_tokens")
    for i in range(len(frame)):
        shape = StepShape(*(int(frame.at[i, name]) for name in columns))
        if saved[i] > 0:
            keep = max(0.0, 1.0 - saved[i] / shape.num_context_tokens)
            shape.num_context_tokens = round(shape.num_context_tokens * keep)
            shape.num_padded_context_tokens = round(shape.num_padded_context_tokens * keep)
        frame.at[i, "wall_time_s"] = (
            true.step_time_s(shape) + true.demoted_read_time_s(saved[i])
            + true.requantize_time_s(requantized[i])
            + true.swap_time_s(int(frame.at[i, "num_swap_out_pages"]),
                               int(frame.at[i, "num_swap_out_transfers"]))
            + true.copy_time_s(int(frame.at[i, "num_copied_pages"])))
    fitted = fit_cost_model(frame)
    for name, value in true.coefficients().items():
        assert fitted.coefficients()[name] == pytest.approx(value, rel=1e-6), name
    # without the column, the same steps fit worse: demoted reads are put on other terms
    blind = fit_cost_model(frame.drop(columns=["num_saved_context_tokens",
                                               "num_requantized_pages"]))
    assert blind.demoted_context_token_s == blind.requantize_page_s == 0.0
    assert blind.fit["r2"] < fitted.fit["r2"]
    # the model file keeps the term (written only where it is not 0)
    assert CalibratedCostModel.from_json(fitted.to_json()).demoted_context_token_s == \
        pytest.approx(4e-6, rel=1e-6)
    assert "demoted_context_token_s" not in TRUE.to_json()["coefficients"]


def test_a_model_fitted_without_requantizations_charges_them_as_page_copies():
    assert TRUE.requantize_time_s(2.5) == pytest.approx(2.5 * TRUE.copy_page_s)
    fitted = dataclasses.replace(TRUE, requantize_page_s=7e-4)
    assert fitted.requantize_time_s(2.5) == pytest.approx(2.5 * 7e-4)
    assert fitted.scaled(2.0).requantize_page_s == pytest.approx(14e-4)


def test_calibrate_prints_a_precision_policys_terms_only_where_fitted():
    assert "demoted_context_token" not in format_fit(TRUE)
    fitted = dataclasses.replace(TRUE, demoted_context_token_s=4e-6, requantize_page_s=3e-4)
    printed = format_fit(fitted)
    assert "demoted_context_token (us):             4.0000" in printed
    assert "requantize_page (us):                   300.0000" in printed
