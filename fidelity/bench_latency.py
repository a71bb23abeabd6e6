"""A server's latency outside its engine's steps, from a bench run: its API latency, a
line in the requests in flight (`api_latency_fit`), and what its front end adds inside the
server (`in_server_latency`)."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from kvlab.bench.observed import histogram_mean_ms, series_increase
from kvlab.sim.api_latency import (
    api_delays,
    api_latency_terms,
    in_flight_at_send,
    scheduler_arrivals,
)
from kvlab.sim.calibrated import CalibratedCostModel

if TYPE_CHECKING:
    from kvlab.bench import BenchResult
    from kvlab.metrics import RunResult

from kvlab.fidelity.bench_tuning import (
    MIN_LATENCY_INTERVALS,
    MIN_LOAD_SPREAD,
    THEIL_SEN_POINTS,
)


def in_server_latency(runs: Sequence[BenchResult], sims: Sequence[RunResult],
                      cost_model: CalibratedCostModel) -> tuple[float, str]:
    """Seconds of a request's TTFT that the server spends outside its engine's steps and its
    measured API latency (its front end handing a request to its engine, the first token
    back), from each run and its simulation under `cost_model`.

    Where every run has the server's queue-time and prefill-time histograms beside its TTFT
    (vLLM, kvlab serve): the mean over the runs of its TTFT less its queue and prefill times
    (`engine_intake_overhead`: those two count from when its engine takes a request in, at a
    step's boundary), less the simulation's mean wait for the step running at an arrival
    (`mean_boundary_wait`), which the simulator makes itself. Else the median, over the
    requests with a first token in both, of the client's TTFT less the simulated one
    (`median_ttft_residual`). Why the histograms first: the residual of a busy run takes in
    the simulator's queue errors (vLLM at 10x: 69 ms, where its histograms left 25-33 ms,
    the step's wait included). Returns (seconds, where they came from: "server histograms"
    or "TTFT residuals")."""
    overheads = [engine_intake_overhead(run) for run in runs]
    if not runs or None in overheads:
        return median_ttft_residual(runs, sims), "TTFT residuals"
    waits = [mean_boundary_wait(sim, cost_model) for sim in sims]
    return float(np.mean([cast("float", overhead) - wait for overhead, wait
                          in zip(overheads, waits, strict=True)])), "server histograms"


def engine_intake_overhead(run: BenchResult) -> float | None:
    """Seconds of the server's own mean TTFT outside its engine's queue and prefill: the
    wait for the running step before its engine takes a request in, and the way in and out
    (None where it exports no such histograms)."""
    means = [histogram_mean_ms(run.series, column)
             for column in ("ttft", "queue_time", "prefill_time")]
    if None in means:
        return None
    ttft, queue, prefill = cast("list[float]", means)
    return (ttft - queue - prefill) / 1000.0


def mean_boundary_wait(sim: RunResult, cost_model: CalibratedCostModel) -> float:
    """The mean over a simulation's scheduled requests of the wait from when its scheduler
    saw each (send plus API latency) to the end of the step then running (0 when none
    ran: an idle engine takes it at once)."""
    requests = sim.requests
    per_request = api_latency_terms(cost_model)[1]
    in_flight = in_flight_at_send(requests) if per_request else None
    arrivals = scheduler_arrivals([r.arrival_s for r in requests],
                                  api_delays(requests, cost_model, in_flight))
    starts, durations = sim.steps.columns["start_s"], sim.steps.columns["duration_s"]
    waits = []
    for request, arrival in zip(requests, arrivals, strict=True):
        if request.first_scheduled_s is None:
            continue
        running = bisect_left(starts, arrival) - 1  # a step starting at the arrival takes it
        waits.append(max(0.0, starts[running] + durations[running] - arrival)
                     if running >= 0 else 0.0)
    return float(np.mean(waits)) if waits else 0.0


def median_ttft_residual(runs: Sequence[BenchResult], sims: Sequence[RunResult]) -> float:
    """The median, over every request with a first token in both, of the client's TTFT less
    the simulated one (0 with none). Why the median: a busy calibration run whose queue the
    simulator gets wrong moves a mean by tens of milliseconds."""
    residuals = []
    for run, sim in zip(runs, sims, strict=True):
        simulated = {r.request_id: r.first_token_s - r.arrival_s for r in sim.requests
                     if r.first_token_s is not None}
        residuals += [ttft - simulated[r.request_id] for r in run.requests
                      if (ttft := r.ttft_s) is not None and r.request_id in simulated]
    return float(np.median(residuals)) if residuals else 0.0


@dataclass(slots=True, frozen=True)
class ApiLatency:
    """A server's API latency as fitted: seconds per request, seconds more per request in
    flight at its send, and whether the server's own TTFT measured them (its histogram)."""

    base_s: float
    per_request_s: float
    measured: bool


def api_latency_fit(runs: Sequence[BenchResult], measured: Sequence[dict[str, Any]]
                    ) -> ApiLatency:
    """The server's API latency: a Theil-Sen line in the requests in flight through the
    scrape intervals of every run (`latency_by_load`), where they show a rising load term;
    else the constant alone, the runs' mean of `api_latency` (too few intervals, loads all
    alike, or no rise). Not measured where no run has the server's TTFT histogram (then 0,
    for stage 2 to fit). Why Theil-Sen (the median of the pairwise slopes): an interval
    holding a few requests is noisy, and against kvlab serve such outliers lifted a
    least-squares line's intercept to twice the latency seen with two requests in flight."""
    constant = float(np.mean([api_latency(run, m) for run, m in zip(runs, measured,
                                                                     strict=True)]))
    was_measured = any(series_increase(run.series, "ttft_count_total") for run in runs)
    points = np.array([point for run in runs for point in latency_by_load(run)])
    if len(points) < MIN_LATENCY_INTERVALS or np.ptp(points[:, 0]) < MIN_LOAD_SPREAD:
        return ApiLatency(constant, 0.0, was_measured)
    base, per_request = theil_sen(points[:, 0], points[:, 1])
    if not per_request > 0:
        return ApiLatency(constant, 0.0, was_measured)
    return ApiLatency(max(0.0, base), per_request, True)


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line through the points: the median slope over
    the pairs with distinct x, then the median intercept under it. Over at most
    THEIL_SEN_POINTS points, evenly spaced in the given order (the pairs grow as their
    square)."""
    if len(x) > THEIL_SEN_POINTS:
        keep = np.linspace(0, len(x) - 1, THEIL_SEN_POINTS).round().astype(int)
        x, y = x[keep], y[keep]
    first, second = np.triu_indices(len(x), k=1)
    dx = x[second] - x[first]
    distinct = dx != 0
    slope = float(np.median((y[second] - y[first])[distinct] / dx[distinct]))
    return float(np.median(y - slope * x)), slope


def latency_by_load(result: BenchResult) -> list[tuple[float, float, int]]:
    """(mean requests in flight at the sends, mean API latency in seconds, requests) of each
    interval between two scrapes of a run in which the server counted as many first tokens
    as the client received: the client's mean TTFT there less the server's own (its TTFT
    histogram's increase). Empty where the server exports no TTFT histogram."""
    series = result.series
    times, sums, counts = (series.get(key) for key in ("time_s", "ttft_sum_total",
                                                       "ttft_count_total"))
    if not times or not sums or not counts:
        return []
    sent = [r for r in result.requests if r.arrival_s == r.arrival_s]  # (nan: never sent)
    load = in_flight_at_send(sent)
    firsts = sorted((r.arrival_s + r.ttft_s, r.ttft_s, load[r.request_id])
                    for r in sent if r.ttft_s is not None)
    first_times = [first for first, _, _ in firsts]
    points = []
    for index in range(len(times) - 1):
        count = counts[index + 1] - counts[index]
        total = sums[index + 1] - sums[index]
        if not count > 0 or not math.isfinite(total):
            continue
        inside = firsts[bisect_right(first_times, times[index]):
                        bisect_right(first_times, times[index + 1])]
        if len(inside) != count:  # a first token on the other side of a scrape
            continue
        client = float(np.mean([ttft for _, ttft, _ in inside]))
        points.append((float(np.mean([n for _, _, n in inside])), client - total / count,
                       len(inside)))
    return points


def api_latency(result: BenchResult, measured: dict[str, Any]) -> float:
    """What the server's API adds to a request's latency: the client's mean TTFT less the
    server's own (its TTFT histogram over the run); 0 when the server exports none."""
    server_ms = histogram_mean_ms(result.series, "ttft")
    if server_ms is None:
        return 0.0
    return max(0.0, (measured["mean_ttft_ms"] - server_ms) / 1000.0)
