"""Arrival resampling (vLLM's gamma process), time scaling and their flag errors."""

import math

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.traces import apply_arrivals, load_random, load_trace, resample_arrivals


def test_resampled_gaps_average_one_over_the_rate():
    arrivals = resample_arrivals(40_000, request_rate=5.0, seed=3)
    assert arrivals[0] == 0.0
    assert np.diff(arrivals).mean() == pytest.approx(0.2, rel=0.02)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_burstiness_sets_the_gap_variability(burstiness):
    gaps = np.diff(resample_arrivals(40_000, request_rate=2.0, burstiness=burstiness, seed=1))
    assert gaps.mean() == pytest.approx(0.5, rel=0.03)
    # A gamma with shape k has coefficient of variation 1/sqrt(k).
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_resampling_is_seeded():
    a = resample_arrivals(100, request_rate=3.0, seed=11)
    assert np.array_equal(a, resample_arrivals(100, request_rate=3.0, seed=11))
    assert not np.array_equal(a, resample_arrivals(100, request_rate=3.0, seed=12))


def test_infinite_rate_sends_everything_at_zero():
    assert resample_arrivals(4, request_rate=math.inf).tolist() == [0.0] * 4


def test_rate_resamples_a_trace_keeping_order_and_lengths():
    base = load_trace("azure", num_prompts=200)
    trace = load_trace("azure", num_prompts=200, request_rate=50.0, seed=2)
    assert trace.requests[0].arrival_s == 0.0
    assert [r.input_len for r in trace.requests] == [r.input_len for r in base.requests]
    assert trace.requests[-1].arrival_s != base.requests[-1].arrival_s
    assert trace.metadata["request_rate"] == 50.0


def test_changing_the_rate_keeps_synthetic_lengths():
    slow = load_trace("random", num_prompts=30, random_range_ratio=0.5, request_rate=1.0)
    fast = load_trace("random", num_prompts=30, random_range_ratio=0.5, request_rate=9.0)
    assert [r.input_len for r in slow.requests] == [r.input_len for r in fast.requests]


def test_time_scale_divides_trace_timestamps():
    base = load_trace("mooncake", num_prompts=50)
    fast = load_trace("mooncake", num_prompts=50, time_scale=4.0)
    assert [r.arrival_s for r in fast.requests] == pytest.approx(
        [r.arrival_s / 4 for r in base.requests])
    assert fast.metadata["time_scale"] == 4.0


def test_defaults_leave_the_trace_unchanged():
    trace = load_random(num_prompts=3)
    assert apply_arrivals(trace) is trace


@pytest.mark.parametrize("options, flag", [
    ({"request_rate": 0}, "request_rate"),
    ({"request_rate": -1.0}, "request_rate"),
    ({"request_rate": math.nan}, "request_rate"),
    ({"burstiness": 0.0}, "burstiness"),
    ({"time_scale": 0.0}, "time_scale"),
    ({"time_scale": -2.0}, "time_scale"),
])
def test_bad_value_names_its_setting(options, flag):
    with pytest.raises(KvlabError, match=f"^{flag} "):
        load_trace("random", num_prompts=2, **options)


def test_time_scale_and_request_rate_together_are_an_error():
    with pytest.raises(KvlabError, match=r"give only one of them"):
        load_trace("azure", time_scale=2.0, request_rate=4.0)


def test_an_infinite_rate_sends_a_trace_at_once_as_vllm_does():
    # issue 15 #4: `--request-rate inf` is vLLM's "everything at t=0"; no rate replays
    from kvlab.traces import load_trace

    replayed = load_trace("azure", None, num_prompts=5)
    burst = load_trace("azure", None, num_prompts=5, request_rate=math.inf)
    assert len({r.arrival_s for r in replayed.requests}) > 1
    assert [r.arrival_s for r in burst.requests] == [0.0] * 5
    assert [r.input_len for r in burst.requests] == [r.input_len for r in replayed.requests]


def test_ramp_up_rates_follow_vllms_formulas():
    from kvlab.traces import RampUp

    linear = RampUp("linear", 2.0, 10.0).rates(5)
    assert linear.tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]
    exponential = RampUp("exponential", 1.0, 16.0).rates(5)
    assert exponential.tolist() == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0])


def test_ramp_up_arrivals_speed_up_and_are_seeded():
    from kvlab.traces import RampUp, ramp_arrivals

    ramp = RampUp("linear", 1.0, 100.0)
    arrivals = ramp_arrivals(2000, ramp, seed=3)
    assert arrivals[0] == 0.0 and (np.diff(arrivals) >= 0).all()
    gaps = np.diff(arrivals)
    assert gaps[:200].mean() > 5 * gaps[-200:].mean()  # early requests come slowly
    assert ramp_arrivals(2000, ramp, seed=3).tolist() == arrivals.tolist()


@pytest.mark.parametrize("argv, message", [
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"],
     "--ramp-up-strategy linear needs --ramp-up-start-rps and --ramp-up-end-rps"),
    (["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2"], "need --ramp-up-strategy"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "2"],
     "--ramp-up-start-rps 5 is above --ramp-up-end-rps 2"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "2"],
     "--ramp-up-start-rps 0.0: expected requests/s > 0"),
    (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2",
      "--request-rate", "3"], "give no --request-rate or --time-scale"),
])
def test_bad_ramp_up_flags_are_one_line(argv, message, capsys):
    from kvlab.cli import main

    assert main(["sim", "--num-prompts", "3", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_ramp_up_reaches_the_report_and_the_result(tmp_path, capsys):
    import json

    from kvlab.cli import main

    assert main(["sim", "--num-prompts", "6", "--ramp-up-strategy", "exponential",
                 "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "8", "--disable-tqdm",
                 "--save-result", "--result-dir", str(tmp_path), "--result-filename",
                 "r.json"]) == 0
    assert "Ramp-up RPS:                             1 to 8" in capsys.readouterr().out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert (saved["ramp_up_strategy"], saved["ramp_up_start_rps"],
            saved["ramp_up_end_rps"]) == ("exponential", 1.0, 8.0)
