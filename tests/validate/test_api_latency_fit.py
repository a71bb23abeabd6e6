"""The API latency a bench run shows (`api_latency_fit`): the client's TTFT less the server's,
scrape interval by scrape interval, as a line in the requests in flight, and the constant where
the run cannot show a load term (stage 2 leaving a measured one alone: test_from_bench)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvlab.fidelity.from_bench import api_latency_fit, latency_by_load, theil_sen

SERVER_TTFT_S = 0.02
SCRAPE_S = 0.25


def _run(base_s: float, per_request_s: float, *, gap_s: float = 0.1,
         histogram: bool = True) -> SimpleNamespace:
    """40 requests sent `gap_s` apart, each 0.95 s long: the client sees the server's TTFT
    plus base + per_request x (requests in flight at its send); scraped every 0.25 s."""
    requests = []
    for i in range(40):
        sent = gap_s * i
        in_flight = sum(1 for j in range(i) if gap_s * j + 0.95 > sent)
        ttft = SERVER_TTFT_S + base_s + per_request_s * in_flight
        requests.append(SimpleNamespace(request_id=i, arrival_s=sent, ttft_s=ttft,
                                        finish_s=sent + 0.95))
    end = requests[-1].finish_s
    times = [SCRAPE_S * k for k in range(int(end / SCRAPE_S) + 2)]
    series: dict[str, list[float]] = {"time_s": times}
    if histogram:
        firsts = [r.arrival_s + r.ttft_s for r in requests]
        series["ttft_count_total"] = [float(sum(f <= t for f in firsts)) for t in times]
        series["ttft_sum_total"] = [SERVER_TTFT_S * c for c in series["ttft_count_total"]]
    mean_ms = 1000 * sum(r.ttft_s for r in requests) / len(requests)
    return SimpleNamespace(requests=requests, series=series, measured={"mean_ttft_ms": mean_ms})


def _fit(runs):
    return api_latency_fit(runs, [run.measured for run in runs])


def test_a_latency_that_grows_with_the_load_is_fitted_as_a_line():
    runs = [_run(0.003, 0.0005), _run(0.003, 0.0005, gap_s=0.05)]
    assert all(len(latency_by_load(run)) >= 6 for run in runs)
    fit = _fit(runs)
    assert fit.measured
    assert fit.base_s == pytest.approx(0.003, abs=1e-6)
    assert fit.per_request_s == pytest.approx(0.0005, rel=1e-3)


def test_without_a_load_spread_or_a_rise_the_constant_is_kept():
    alone = _fit([_run(0.004, 0.0, gap_s=2.0)])  # nobody else in flight at any send
    assert (alone.base_s, alone.per_request_s, alone.measured) == (pytest.approx(0.004), 0.0,
                                                                  True)
    flat = _fit([_run(0.004, 0.0)])  # loads spread, the latency does not rise
    assert flat.per_request_s == 0.0 and flat.base_s == pytest.approx(0.004)


def test_a_server_without_a_ttft_histogram_leaves_the_latency_to_stage_2():
    fit = _fit([_run(0.004, 0.0005, histogram=False)])
    assert (fit.base_s, fit.per_request_s, fit.measured) == (0.0, 0.0, False)


def test_an_interval_far_off_the_line_does_not_move_it():
    loads = np.arange(10.0)
    latencies = 0.003 + 0.001 * loads
    latencies[2] = 0.05  # a scrape interval of one slow request
    base, per_request = theil_sen(loads, latencies)
    assert (base, per_request) == (pytest.approx(0.003), pytest.approx(0.001))
    many = np.arange(5000.0)  # thinned to THEIL_SEN_POINTS, the same line
    assert theil_sen(many, 0.002 + 0.0001 * many) == (pytest.approx(0.002),
                                                       pytest.approx(0.0001))
