"""How far the simulator is from a real server (vLLM, vLLM-Ascend, `kvlab serve`): windows of
one trace benchmarked against it (`kvlab bench serve`), one cost model fitted on the
calibration windows together (`fit_bench`), each validated window simulated with it on the
server's own configuration; then the same table as `validate`'s, simulator against server.

Calibration and validated windows are sent in turn (calibration 1, validated 1, calibration
2, ...), so that a drift of a shared machine meets both. With repeats, the whole sequence is
sent that many times (rounds), and each window is judged on its repeats pooled: the server's
expected behaviour on that window, which the deterministic simulator predicts, instead of one
draw of a noisy machine; each window also reports how far its repeats were from each other
(the server's own spread, the floor of any prediction of one run). With a standard error to
reach (`until_std_error`), rounds go on until every window's pooled means are that sure (or the
rounds run out), so that a noisy machine gets the runs it needs and a quiet one no more.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.bench import BenchRequest, BenchResult, ClientConfig, bench_serve
from kvlab.bench.observed import series_increase
from kvlab.errors import KvlabError
from kvlab.fidelity.from_bench import (
    SUMMARY_OPTIONS,
    bench_trace,
    fit_bench,
    server_sim_config,
    steal_share,
    steal_warnings,
)
from kvlab.fidelity.validation import WINDOW_METRICS, ValidationResult, compare_metrics
from kvlab.metrics import RunResult, merge_runs, summarize
from kvlab.sim import SimConfig, simulate
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.specs import ModelSpec
from kvlab.traces import Trace

REFERENCE = "server"
# `speed_sensitivity` simulates each window again with every step this much longer and shorter.
SPEED_STEP = 0.05
# A window whose mean TTFT moves more than this many percent per 1% of step time is a queue
# (a burst of arrivals waiting for prefills): a warning says its TTFT judges the server's own
# speed in each run more than the model (docs/validation.md).
QUEUE_SENSITIVITY = 2.0
# A window some of whose runs preempted no request while another preempted at least this
# many is on the edge of the server's KV memory: a warning says so (`preemption_warnings`).
PREEMPTION_EDGE = 3
# A window whose pooled server metric is uncertain by more than this many percent (one
# standard error of the mean over its runs) is a warning: a simulator error under about
# twice that is within the server's own noise (`noise_warnings`).
NOISY_POOL_PERC = 5.0
# `until_std_error` judges a pool's standard error from this many rounds on: from two runs it
# is itself too unsure to stop on (one difference).
MIN_ROUNDS_TO_SETTLE = 3


@dataclass(slots=True)
class ServerWindow:
    """One validated window: the server's benchmarks of it (one per repeat), the simulator's
    runs of the same requests (one per repeat, each under that repeat's steal), the cost
    model used and how it was obtained."""

    benches: list[BenchResult]
    sims: list[RunResult]
    cost_model: CalibratedCostModel
    calibration: str
    warnings: list[str]
    sensitivity: dict[str, float | None] | None = None  # `speed_sensitivity`, where computed


@dataclass(slots=True, frozen=True)
class ServerTarget:
    """The server to validate against and how to simulate it: the client settings, its model
    card, the vocabulary of the prompts, the simulator's model, the scheduling preset and any
    serving overrides (ServingConfig.create keywords)."""

    client: ClientConfig
    card: dict[str, Any]
    vocab_size: int
    model: str | ModelSpec
    preset: str | None = None
    overrides: dict[str, Any] | None = None
    seed: int = 0


def validate_server(
    target: ServerTarget,
    windows: Sequence[tuple[Trace, Trace | None]],
    *,
    cost_model: CalibratedCostModel | None = None,
    calibrate_on_same_run: bool = False,
    num_repeats: int = 1,
    until_std_error: float | None = None,
    on_finish: Callable[[BenchRequest], object] | None = None,
) -> ValidationResult:
    """Benchmark every window (its calibration requests, then its validated ones;
    `num_repeats` rounds of that, or with `until_std_error` (a fraction) as few rounds, from
    MIN_ROUNDS_TO_SETTLE on, as leave every window's pooled server means (throughput, mean
    TTFT and TPOT) within that relative standard error), fit one cost model on all calibration
    runs together
    (`fit_bench`: a short window's fit follows that window's share of the machine's drift, the
    pooled one averages it), simulate each validated run with it, and compare the pooled
    requests of all windows, as `validate` does for the engine; each window keeps its own
    comparison (its repeats pooled) in `windows`."""
    separate = cost_model is None and not calibrate_on_same_run
    if separate and any(cal is None or not len(cal) for _, cal in windows):
        raise KvlabError("no calibration: give cost_model FILE, calibration windows with "
                         "requests, or calibrate_on_same_run",
                         parameters=("cost_model", "calibrate_on_same_run"))
    _check_repeats(num_repeats, until_std_error)
    calibration_runs: list[BenchResult] = []
    validated: list[list[BenchResult]] = [[] for _ in windows]
    for round_number in range(1, num_repeats + 1):  # a window's repeats meet the run's drift
        for repeats, (trace, calibration_trace) in zip(validated, windows, strict=True):
            if separate and calibration_trace is not None:
                calibration_runs.append(_bench(target, calibration_trace, on_finish))
            repeats.append(_bench(target, trace, on_finish))
        if (until_std_error is not None and round_number >= MIN_ROUNDS_TO_SETTLE
                and max_pool_std_error(validated) <= until_std_error):
            break
    num_rounds = len(validated[0])
    every_validated = [bench for repeats in validated for bench in repeats]
    config = server_sim_config(every_validated[0].server, target.model, preset=target.preset,
                               overrides=target.overrides)
    warnings: list[str] = []
    if cost_model is not None:
        calibration = "given"
    else:
        fitted_on = calibration_runs or every_validated
        fit = fit_bench(fitted_on, config, source=", ".join(
            str(run.run.metadata.get("dataset")) for run in fitted_on))
        cost_model, warnings = fit.cost_model, fit.warnings
        calibration = ("same runs (optimistic)" if not calibration_runs else
                       f"separate runs, each before its window: {len(calibration_runs)} "
                       f"run(s) of {len(calibration_runs[0].requests)} requests, one fit")
    runs = []
    for benches in validated:
        sims = simulate_window(benches, config, cost_model)
        for sim in sims:
            sim.metadata["hardware"] = f"sim of {target.client.base_url}"
        runs.append(ServerWindow(benches, sims, cost_model, calibration, warnings,
                                 speed_sensitivity(benches, config, cost_model, sims)))
    server_summary = pooled_server_summary(every_validated)
    sim_summary = _summarize(merge_runs([sim for run in runs for sim in run.sims]))
    result = ValidationResult(
        metrics=compare_metrics(sim_summary, server_summary, reference=REFERENCE),
        engine_summary=server_summary,
        sim_summary=sim_summary,
        cost_model=cost_model,
        calibration=calibration,
        reference=REFERENCE,
        warnings=[*warnings, *steal_warnings(every_validated, "window",
                                             cost_model.host_steal_slowdown,
                                             labels=_run_labels(len(windows), num_rounds)),
                  *queue_warnings([run.sensitivity for run in runs]),
                  *preemption_warnings(_by_window(calibration_runs, len(windows)),
                                       "calibration window"),
                  *preemption_warnings(validated, "window")],
    )
    if len(runs) > 1 or num_rounds > 1:
        result.windows = [window_json(run) for run in runs]
        if until_std_error is None:
            result.warnings += noise_warnings(result.windows)
        elif (unsettled := noise_warnings(result.windows, 100.0 * until_std_error)):
            result.warnings += [f"--until-std-error {100.0 * until_std_error:g}%: not reached "
                                f"in {num_rounds} rounds (--num-repeats)", *unsettled]
    return result


def _check_repeats(num_repeats: int, until_std_error: float | None) -> None:
    if isinstance(num_repeats, bool) or not isinstance(num_repeats, int) or num_repeats < 1:
        raise KvlabError(f"--num-repeats {num_repeats!r}: expected 1 or more",
                         parameters=("num_repeats",))
    if until_std_error is None:
        return
    if not isinstance(until_std_error, (int, float)) or not until_std_error > 0:
        given = (f"{100.0 * until_std_error:g}" if isinstance(until_std_error, (int, float))
                 else repr(until_std_error))
        raise KvlabError(f"--until-std-error {given}: expected a percentage > 0",
                         parameters=("until_std_error",))
    if num_repeats < MIN_ROUNDS_TO_SETTLE:
        raise KvlabError(f"--num-repeats {num_repeats} with --until-std-error: expected "
                         f"{MIN_ROUNDS_TO_SETTLE} or more (the most rounds; a standard error "
                         f"is judged from {MIN_ROUNDS_TO_SETTLE} runs on)",
                         parameters=("num_repeats", "until_std_error"))


def max_pool_std_error(validated: Sequence[Sequence[BenchResult]]) -> float:
    """The largest relative standard error of any window's pooled server mean throughput,
    TTFT or TPOT, over its runs so far (`validated`: each window's runs); inf while a window
    has fewer than two runs."""
    errors = [spread["rel_std_error"]
              for benches in validated
              for spread in repeat_spread(benches, pooled_server_summary(benches)).values()]
    return max((math.inf if error is None else error for error in errors), default=math.inf)


def _run_labels(num_windows: int, num_repeats: int) -> list[str]:
    """Each validated run's name, window by window: "window K" (", run R" with repeats)."""
    return [f"window {window}" + (f", run {run}" if num_repeats > 1 else "")
            for window in range(1, num_windows + 1) for run in range(1, num_repeats + 1)]


def simulate_window(benches: Sequence[BenchResult], config: SimConfig,
                    cost_model: CalibratedCostModel) -> list[RunResult]:
    """The simulator's run of each benchmark of one window (its repeats) on the server's
    configuration, each slowed by the steal measured during it."""
    return [simulate(bench_trace(bench), config,
                     cost_model=cost_model.under_steal(steal_share(bench)))
            for bench in benches]


def speed_sensitivity(benches: Sequence[BenchResult], config: SimConfig,
                      cost_model: CalibratedCostModel,
                      sims: Sequence[RunResult]) -> dict[str, float | None]:
    """How far each window metric (`WINDOW_METRICS`) of the simulated window moves, in
    percent, per 1% longer steps: its runs simulated again with every step `SPEED_STEP`
    longer and shorter (a central difference over the fitted runs, `sims`). About -1 for the
    output throughput and +1 for TPOT; a mean TTFT far above 1 is a queue, which multiplies
    any change of the server's own speed (a noisy machine's runs of one window then differ
    in TTFT by several times their speed)."""
    base = _summarize(merge_runs(list(sims)))
    slow, fast = (_summarize(merge_runs(simulate_window(benches, config,
                                                        cost_model.scaled(1.0 + step))))
                  for step in (SPEED_STEP, -SPEED_STEP))
    moves: dict[str, float | None] = {}
    for key in WINDOW_METRICS:
        centre, high, low = base.get(key), slow.get(key), fast.get(key)
        moves[key] = (None if centre is None or high is None or low is None or not centre
                      else (high - low) / centre / (2.0 * SPEED_STEP))
    return moves


def queue_warnings(sensitivities: Sequence[dict[str, float | None] | None]) -> list[str]:
    """A warning for each window (numbered from 1) whose mean TTFT is a queue
    (`QUEUE_SENSITIVITY`)."""
    warnings = []
    for number, moves in enumerate(sensitivities, start=1):
        ttft = (moves or {}).get("mean_ttft_ms")
        if ttft is not None and ttft > QUEUE_SENSITIVITY:
            warnings.append(
                f"window {number}: its mean TTFT moves {ttft:.1f}% per 1% of the server's step "
                "time (requests queue for their prefill), so each run's TTFT follows the "
                "server's speed in that run more than the model; a lower load (--time-scale, "
                "--request-rate) judges the model better")
    return warnings


def preemption_warnings(windows: Sequence[Sequence[BenchResult]], role: str) -> list[str]:
    """A warning for each window (numbered from 1; `windows`: each one's runs) that the
    server preempted no request in one run and `PREEMPTION_EDGE` or more in another: whether
    its requests are preempted depends on its speed in the run (vLLM at 2x under 64 MiB:
    0, 0 and 13 preemptions, mean TTFT 49-312 ms), and the simulator, deterministic, takes
    one side for all of them."""
    warnings = []
    for number, runs in enumerate(windows, start=1):
        counts = [int(count) for run in runs  # (the summary's count, without the rest of it)
                  if (count := series_increase(run.series, "num_preemptions_total")) is not None]
        if len(counts) > 1 and min(counts) == 0 and max(counts) >= PREEMPTION_EDGE:
            warnings.append(
                f"{role} {number}: the server preempted {_listed(counts)} times in its runs "
                "of it: its KV memory is at the edge of this load, where each run's speed "
                "decides whether requests are preempted (and their TTFT by up to seconds); "
                "more KV memory on the server or a lower load judges the model better")
    return warnings


def _listed(counts: Sequence[int]) -> str:
    """'0, 0 and 13'."""
    words = [str(count) for count in counts]
    return ", ".join(words[:-1]) + f" and {words[-1]}"


def _by_window(runs: Sequence[BenchResult], num_windows: int) -> list[list[BenchResult]]:
    """Runs made in rounds over `num_windows` windows, grouped by window."""
    return [list(runs[index::num_windows]) for index in range(num_windows)]


def _bench(target: ServerTarget, trace: Trace,
           on_finish: Callable[[BenchRequest], object] | None) -> BenchResult:
    result = bench_serve(trace, target.client, card=target.card, vocab_size=target.vocab_size,
                         seed=target.seed, on_finish=on_finish)
    failed = [r for r in result.requests if not r.completed]
    if len(failed) == len(result.requests):
        raise KvlabError(f"every request of {trace.name} failed at the server: "
                         f"{failed[0].error}")
    return result


def _summarize(result: RunResult) -> dict[str, Any]:
    return summarize(result, **SUMMARY_OPTIONS)


def pooled_server_summary(results: Sequence[BenchResult]) -> dict[str, Any]:
    """Benchmarks (windows, or repeats of one) as one summary: latencies and throughputs
    over the pooled requests (`merge_runs`), the KV section pooled as well (usage means
    weighted by duration, peaks the largest, counters added up, hit rate over all lookups)."""
    summaries = [result.summary(**SUMMARY_OPTIONS) for result in results]
    if len(results) == 1:
        return summaries[0]
    pooled = _summarize(merge_runs([result.run for result in results]))
    for key in ("mean_kv_usage_perc", "peak_kv_usage_perc", "num_preemptions",
                "num_swaps_out", "prefix_cache_hit_rate_perc", "page_size", "num_total_pages",
                "kv_cache_size_tokens", "num_swaps_in", "kv_token_state_perc",
                "internal_fragmentation_perc", "external_fragmentation_perc",
                "num_swap_out_pages", "num_swap_in_pages", "num_host_pages"):
        pooled.pop(key, None)
    pooled.update(_pooled_kv(summaries, [result.run.duration_s for result in results],
                             results))
    pooled["host_cpu_steal_perc"] = pooled_steal_perc(results)
    pooled["dataset"] = f"{summaries[0].get('dataset')} and {len(results) - 1} more runs"
    return pooled


def _pooled_kv(summaries: list[dict[str, Any]], durations: list[float],
               results: Sequence[BenchResult]) -> dict[str, Any]:
    def values(key: str) -> list[Any]:
        return [s.get(key) for s in summaries]

    def total(key: str) -> Any:
        found = values(key)
        return None if any(v is None for v in found) else sum(found)

    means = values("mean_kv_usage_perc")
    weighted = (None if any(v is None for v in means) or not sum(durations) else
                sum(m * d for m, d in zip(means, durations, strict=True)) / sum(durations))
    peaks = [v for v in values("peak_kv_usage_perc") if v is not None]
    queries = sum(_increase(r, "prefix_cache_queries_total") for r in results)
    hits = sum(_increase(r, "prefix_cache_hits_total") for r in results)
    first = summaries[0]
    return {
        "mean_kv_usage_perc": weighted,
        "peak_kv_usage_perc": max(peaks) if peaks else None,
        "num_preemptions": total("num_preemptions"),
        "num_swaps_out": total("num_swaps_out"),
        "prefix_cache_hit_rate_perc": (100.0 * hits / queries if queries else
                                  first.get("prefix_cache_hit_rate_perc")),
        "page_size": first.get("page_size"),
        "num_total_pages": first.get("num_total_pages"),
        "kv_cache_size_tokens": first.get("kv_cache_size_tokens"),
    }


def pooled_steal_perc(results: Sequence[BenchResult]) -> float | None:
    """The client host's CPU share that the hypervisor withheld over all the runs
    (their ticks added up), in percent; None where a run does not tell."""
    ticks = [result.host_cpu_ticks() for result in results]
    known = [pair for pair in ticks if pair is not None]
    if not known or len(known) < len(ticks):
        return None
    return 100.0 * sum(steal for steal, _ in known) / sum(total for _, total in known)


def _increase(result: BenchResult, column: str) -> float:
    return series_increase(result.series, column) or 0.0


def window_json(run: ServerWindow) -> dict[str, Any]:
    """One window's report: simulator against server on its repeats pooled, with its
    calibration, cost model, steal and (with repeats) the server's own spread."""
    server = pooled_server_summary(run.benches)
    document = {
        "dataset": run.benches[0].run.metadata.get("dataset"),
        "num_prompts": len(run.benches[0].requests),
        "num_repeats": len(run.benches),
        "calibration": run.calibration,
        "cost_model": run.cost_model.to_json(),
        "metrics": compare_metrics(_summarize(merge_runs(run.sims)), server,
                                   reference=REFERENCE),
        "warnings": run.warnings,
        "host_cpu_steal_perc": server.get("host_cpu_steal_perc"),
        "lockstep_identical": None,
    }
    if len(run.benches) > 1:
        document["server_repeats"] = repeat_spread(run.benches, server)
    if run.sensitivity is not None:
        document["speed_sensitivity"] = run.sensitivity
    return document


def repeat_spread(benches: Sequence[BenchResult],
                  pooled: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The server's own spread over repeats of one window (`pooled`: their pooled summary),
    per window metric: each repeat's value, the largest relative distance of one from the
    pooled value (how far a single run of this window strays from what the server does on
    it on average: no prediction of one run can be surer than that), and the relative
    standard error of their mean (how sure the pool itself is of that average; it shrinks
    with the square root of the number of runs)."""
    summaries = [bench.summary(**SUMMARY_OPTIONS) for bench in benches]
    spread: dict[str, dict[str, Any]] = {}
    for key in WINDOW_METRICS:
        values = [summary.get(key) for summary in summaries]
        centre = pooled.get(key)
        known = [float(v) for v in values if v is not None]
        deviation = (max(abs(v - float(centre)) for v in known) / abs(float(centre))
                     if known and centre else None)
        spread[key] = {"values": values, "pooled": centre, "max_rel_deviation": deviation,
                       "rel_std_error": relative_std_error(known, centre)}
    return spread


def relative_std_error(values: list[float], centre: float | None) -> float | None:
    """The standard error of the mean of `values` (sample deviation over sqrt(n)), relative to
    `centre`; None with fewer than two values or no centre."""
    if len(values) < 2 or not centre:
        return None
    return statistics.stdev(values) / math.sqrt(len(values)) / abs(float(centre))


def noise_warnings(windows: Sequence[dict[str, Any]],
                   limit_perc: float = NOISY_POOL_PERC) -> list[str]:
    """A warning for each window report (numbered from 1) whose pooled server metrics are
    uncertain by more than `limit_perc` (one standard error over its runs): the error the
    simulator can be judged on there, and about how many runs would halve it."""
    warnings = []
    for number, window in enumerate(windows, start=1):
        spread = window.get("server_repeats") or {}
        noisy = {key: error for key in WINDOW_METRICS
                 if (error := (spread.get(key) or {}).get("rel_std_error")) is not None
                 and 100.0 * error > limit_perc}
        if not noisy:
            continue
        named = ", ".join(f"{_WINDOW_LABELS[key]} +-{100.0 * error:.1f}%"
                          for key, error in noisy.items())
        runs = window.get("num_repeats", 1)
        warnings.append(
            f"window {number}: its {runs} runs leave the server's own means uncertain by "
            f"{named} (one standard error): a simulator error under about twice that is "
            f"within the server's noise; {4 * runs} runs (--num-repeats) would halve it")
    return warnings


_WINDOW_LABELS = {"output_throughput": "throughput", "mean_ttft_ms": "TTFT",
                  "mean_tpot_ms": "TPOT"}
