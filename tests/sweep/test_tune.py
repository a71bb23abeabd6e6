"""Tuning: the rate bisection against a known threshold, and `kvlab tune` on the simulator,
whose best rate meets the SLOs and whose next probe above it does not."""

import json
import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.sweep import RateSearch, SearchOptions, SerialExecutor, SweepStore, tune

from .sweep_cases import SMALL


def search_for(threshold: float, search: RateSearch) -> RateSearch:
    """Run `search` against a test that passes at rates up to `threshold`."""
    for _ in range(200):
        rate = search.next_rate()
        if rate is None:
            return search
        search.record(rate, rate <= threshold)
    raise AssertionError("the search did not end")


@given(st.floats(0.02, 900.0), st.floats(0.01, 0.5), st.floats(0.05, 50.0))
def test_the_search_brackets_the_threshold_within_the_tolerance(threshold, tolerance, start):
    search = search_for(threshold, RateSearch(start_rate=start, rate_tolerance=tolerance))
    assert search.passing is not None and search.failing is not None
    assert search.passing <= threshold < search.failing
    assert search.failing <= search.passing * (1 + tolerance) * 1.001  # 4-digit rounding
    assert len(search.probes) <= 40


def test_a_threshold_above_the_range_is_capped_and_below_it_is_none():
    high = search_for(5000.0, RateSearch(max_rate=100.0))
    assert high.passing == 100.0 and high.capped and high.failing is None
    low = search_for(0.001, RateSearch(min_rate=0.01))
    assert low.passing is None and low.failing == 0.01


def test_bad_search_bounds_are_named():
    with pytest.raises(KvlabError, match="start_rate 5 is outside"):
        RateSearch(start_rate=5.0, max_rate=2.0)
    with pytest.raises(KvlabError, match="rate_tolerance 0"):
        RateSearch(rate_tolerance=0.0)


SLOS = {"ttft": 2000.0, "tpot": 100.0}
OPTIONS = SearchOptions(start_rate=4.0, rate_tolerance=0.1, max_rate=256.0)


def test_tune_ranks_candidates_by_the_highest_rate_meeting_the_slos(tmp_path):
    candidates = [{**SMALL, "num_prompts": 60, "policy": policy}
                  for policy in ("contiguous:reserve=max", "paged")]
    candidates = [{k: v for k, v in c.items() if k != "time_scale"} for c in candidates]
    probes = []
    store = SweepStore(tmp_path / "probes")
    table = tune(candidates, SLOS, SerialExecutor(), store=store, options=OPTIONS,
                 on_probe=probes.append)
    assert list(table["param.policy"]) == ["paged", "contiguous:reserve=max"]
    assert table["max_request_rate"].is_monotonic_decreasing
    frame = store.read()
    for row in table.to_dict("records"):
        mine = frame[frame["param.policy"] == row["param.policy"]]
        rate = mine.set_index("param.request_rate")["slo_attainment"]
        assert rate[row["max_request_rate"]] >= 0.9  # the best rate meets the SLOs
        assert rate[row["lowest_failed_rate"]] < 0.9  # and the one above it does not
        assert row["lowest_failed_rate"] <= row["max_request_rate"] * 1.1 * 1.001
        assert row["num_probes"] == len(mine)
    assert len(probes) == len(frame)
    again = []
    rerun = tune(candidates, SLOS, SerialExecutor(), store=store, options=OPTIONS,
                 on_probe=again.append)
    assert again == []  # every probe came from the store
    assert rerun.equals(table)


def test_tune_rejects_candidates_that_set_their_own_arrivals():
    with pytest.raises(KvlabError, match="remove time_scale"):
        tune([{"time_scale": 2.0}], SLOS, SerialExecutor())


def test_kvlab_tune_prints_and_saves_the_ranked_table(tmp_path, capsys):
    out = tmp_path / "tuned"
    assert main(["tune", "--slo", "ttft:2000", "--slo", "tpot:100", "--num-prompts", "40",
                 "--grid", "policy=paged,contiguous:reserve=max", "--start-rate", "4",
                 "--rate-tolerance", "0.2", "--max-rate", "256", "-o", str(out),
                 "--workers", "2", "--disable-tqdm"]) == 0
    printed = capsys.readouterr().out
    assert "Highest request rate with >= 90% of requests meeting ttft <= 2000 ms" in printed
    saved = pd.read_parquet(out / "tune.parquet")
    assert list(saved["rank"]) == [1, 2]
    assert json.loads((out / "tune.json").read_text())[0]["rank"] == 1
    assert len(pd.read_csv(out / "tune.csv")) == 2
    assert len(pd.read_parquet(out / "probes")) == saved["num_probes"].sum()
    best = saved.iloc[0]
    assert best["status"] == "ok" and math.isfinite(best["max_request_rate"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--slo", "ttft:fast"], "--slo 'ttft:fast': expected KEY:MILLISECONDS"),
    (["--slo", "ttfb:100"], "--slo 'ttfb:100': expected KEY:MILLISECONDS with KEY one of"),
    (["--slo", "ttft:100", "--grid", "request_rate=1,2"], "remove --request-rate"),
    (["--slo", "ttft:100", "--start-rate", "5", "--max-rate", "2"],
     "--start-rate 5 is outside [--min-rate 0.01, --max-rate 2]"),
])
def test_bad_tune_input_is_one_line(tmp_path, capsys, argv, message):
    assert main(["tune", *argv, "-o", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
