"""Steal time in the cost model: a model slowed for a host that lost part of its CPU to other
virtual machines (`under_steal`), and stage 1's fit of that slowdown from calibration runs
whose steal shares differ (`steal_step_fit`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab.fidelity.calibration import MEMORY_COLUMNS, TIME_COLUMN, predict
from kvlab.fidelity.from_bench import BENCH_TERMS, steal_step_fit
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.sim.cost_model import StepShape
from tests.validate.test_calibration_fit import synthetic_profile

DEDICATED = CalibratedCostModel(step_overhead_s=7e-3, prefill_token_s=3e-5, decode_token_s=1e-3,
                                context_token_s=5e-8, api_latency_s=0.01,
                                api_latency_per_request_s=0.004, host_steal_slowdown=2.0)


def test_a_model_under_steal_is_slower_by_its_slowdown_but_its_api_latency():
    slowed = DEDICATED.under_steal(0.25)  # 1 + 2.0 x 0.25 = 1.5
    shape = StepShape(num_prefill_tokens=100, num_decode_tokens=8, num_context_tokens=4000,
                      num_seqs=9)
    assert slowed.step_time_s(shape) == pytest.approx(1.5 * DEDICATED.step_time_s(shape))
    assert (slowed.api_latency_s, slowed.api_latency_per_request_s) == (0.01, 0.004)
    assert slowed.host_steal_slowdown == 2.0
    assert DEDICATED.under_steal(0.0) is DEDICATED
    flat = dataclasses.replace(DEDICATED, host_steal_slowdown=0.0)
    assert flat.under_steal(0.3) is flat


def test_a_scaled_model_scales_every_time_but_the_api_latency():
    shape = StepShape(num_prefill_tokens=64, num_decode_tokens=4, num_context_tokens=900,
                      num_seqs=5)
    faster = DEDICATED.scaled(0.8)
    assert faster.step_time_s(shape) == pytest.approx(0.8 * DEDICATED.step_time_s(shape))
    assert faster.recompute_time_s(50) == pytest.approx(0.8 * DEDICATED.recompute_time_s(50))
    assert (faster.api_latency_s, faster.host_steal_slowdown) == (0.01, 2.0)
    assert DEDICATED.scaled(1.0) is DEDICATED
    assert DEDICATED.under_steal(0.1) == DEDICATED.scaled(1.2)


def test_the_slowdown_is_saved_only_when_there_is_one():
    assert "host_steal_slowdown" not in CalibratedCostModel().to_json()["coefficients"]
    assert CalibratedCostModel.from_json(DEDICATED.to_json()) == DEDICATED


def _runs(shares: list[float], slowdown: float, noise: float = 0.03) -> pd.DataFrame:
    """Steps of four runs on hosts that lost `shares` of their CPU, each step slowed by
    1 + slowdown x its run's share."""
    frames = []
    for seed, share in enumerate(shares):
        profile = synthetic_profile(DEDICATED, num_steps=600, seed=seed)
        for column in MEMORY_COLUMNS:
            profile[column] = 0
        rng = np.random.default_rng([seed, 7])
        times = predict(DEDICATED, profile) * (1 + slowdown * share)
        profile[TIME_COLUMN] = times * (1 + noise * rng.standard_normal(len(profile)))
        frames.append(profile.assign(steal_share=share))
    return pd.concat(frames, ignore_index=True)


def test_stage_1_finds_the_slowdown_and_the_dedicated_hosts_steps():
    """kvlab serve on the team's machine: windows that lost 5-23% of the CPU."""
    fitted = steal_step_fit(_runs([0.05, 0.10, 0.07, 0.23], slowdown=2.0), BENCH_TERMS)
    assert fitted.host_steal_slowdown == pytest.approx(2.0, abs=0.5)
    assert fitted.step_overhead_s == pytest.approx(7e-3, rel=0.1)
    assert fitted.decode_token_s == pytest.approx(1e-3, rel=0.1)


def test_runs_with_alike_steal_tell_no_slowdown():
    fitted = steal_step_fit(_runs([0.10, 0.11, 0.10, 0.12], slowdown=2.0), BENCH_TERMS)
    assert fitted.host_steal_slowdown == 0.0
    # the steps as they ran, slowed by the ~10% steal they all had
    assert fitted.step_overhead_s == pytest.approx(7e-3 * 1.21, rel=0.1)


def test_no_steal_is_no_slowdown():
    fitted = steal_step_fit(_runs([0.0, 0.0, 0.0, 0.0], slowdown=0.0), BENCH_TERMS)
    assert fitted.host_steal_slowdown == 0.0
    assert fitted.step_overhead_s == pytest.approx(7e-3, rel=0.1)
