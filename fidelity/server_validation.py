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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.bench import BenchRequest, BenchResult, ClientConfig, bench_serve
from kvlab.errors import KvlabError
from kvlab.fidelity.from_bench import fit_bench, server_sim_config, steal_warnings
from kvlab.fidelity.server_pooling import max_pool_std_error, pooled_server_summary, summarize_run
from kvlab.fidelity.server_warnings import noise_warnings, preemption_warnings, queue_warnings
from kvlab.fidelity.server_window import (
    REFERENCE,
    ServerWindow,
    simulate_window,
    speed_sensitivity,
    window_json,
)
from kvlab.fidelity.validation import ValidationResult, compare_metrics
from kvlab.metrics import merge_runs
from kvlab.sim import SimConfig
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.specs import ModelSpec
from kvlab.traces import Trace

# `until_std_error` judges a pool's standard error from this many rounds on: from two runs it
# is itself too unsure to stop on (one difference).
MIN_ROUNDS_TO_SETTLE = 3


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
    refine: bool = True,
) -> ValidationResult:
    """Benchmark every window (its calibration requests, then its validated ones;
    `num_repeats` rounds of that, or with `until_std_error` (a fraction) as few rounds, from
    MIN_ROUNDS_TO_SETTLE on, as leave every window's pooled server means (throughput, mean
    TTFT and TPOT) within that relative standard error), fit one cost model on all calibration
    runs together
    (`fit_bench`: a short window's fit follows that window's share of the machine's drift, the
    pooled one averages it), simulate each validated run with it, and compare the pooled
    requests of all windows, as `validate` does for the engine; each window keeps its own
    comparison (its repeats pooled) in `windows`. `refine=False`: the fit stops after its
    step fit (`fit_bench`'s stage 1)."""
    separate = cost_model is None and not calibrate_on_same_run
    if separate and any(cal is None or not len(cal) for _, cal in windows):
        raise KvlabError("no calibration: give cost_model FILE, calibration windows with "
                         "requests, or calibrate_on_same_run",
                         parameters=("cost_model", "calibrate_on_same_run"))
    _check_repeats(num_repeats, until_std_error)
    calibration_runs, validated = _bench_rounds(target, windows, separate, num_repeats,
                                                until_std_error, on_finish)
    every_validated = [bench for repeats in validated for bench in repeats]
    config = server_sim_config(every_validated[0].server, target.model, preset=target.preset,
                               overrides=target.overrides)
    warnings: list[str] = []
    if cost_model is not None:
        calibration = "given"
    else:
        cost_model, calibration, warnings = _fit(calibration_runs, every_validated, config,
                                                 refine)
    runs = []
    for benches in validated:
        sims = simulate_window(benches, config, cost_model)
        for sim in sims:
            sim.metadata["hardware"] = f"sim of {target.client.base_url}"
        runs.append(ServerWindow(benches, sims, cost_model, calibration, warnings,
                                 speed_sensitivity(benches, config, cost_model, sims)))
    result = _compare(runs, calibration_runs, validated)
    if len(runs) > 1 or len(validated[0]) > 1:
        result.windows = [window_json(run) for run in runs]
        result.warnings += _settling_warnings(result.windows, until_std_error, len(validated[0]))
    return result


def _bench_rounds(target: ServerTarget, windows: Sequence[tuple[Trace, Trace | None]],
                  separate: bool, num_repeats: int, until_std_error: float | None,
                  on_finish: Callable[[BenchRequest], object] | None
                  ) -> tuple[list[BenchResult], list[list[BenchResult]]]:
    """The server's benchmarks, round after round: (the calibration runs, in the order sent;
    each window's validated runs)."""
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
    return calibration_runs, validated


def _fit(calibration_runs: list[BenchResult], every_validated: list[BenchResult],
         config: SimConfig, refine: bool) -> tuple[CalibratedCostModel, str, list[str]]:
    """One cost model fitted on the calibration runs together (on the validated runs where
    there are none): (the model, how it was obtained, the fit's warnings)."""
    fitted_on = calibration_runs or every_validated
    fit = fit_bench(fitted_on, config, refine=refine, source=", ".join(
        str(run.run.metadata.get("dataset")) for run in fitted_on))
    calibration = ("same runs (optimistic)" if not calibration_runs else
                   f"separate runs, each before its window: {len(calibration_runs)} "
                   f"run(s) of {len(calibration_runs[0].requests)} requests, one fit")
    if not refine:
        calibration += ", its step fit only (no refine)"
    return fit.cost_model, calibration, fit.warnings


def _compare(runs: list[ServerWindow], calibration_runs: list[BenchResult],
             validated: list[list[BenchResult]]) -> ValidationResult:
    """Simulator against server over the pooled requests of every window, with the warnings
    of the fit, the steal, the queues and the preemptions (every window has the same cost
    model, calibration and fit warnings)."""
    every_validated = [bench for repeats in validated for bench in repeats]
    cost_model, calibration = runs[0].cost_model, runs[0].calibration
    server_summary = pooled_server_summary(every_validated)
    sim_summary = summarize_run(merge_runs([sim for run in runs for sim in run.sims]))
    return ValidationResult(
        metrics=compare_metrics(sim_summary, server_summary, reference=REFERENCE),
        engine_summary=server_summary,
        sim_summary=sim_summary,
        cost_model=cost_model,
        calibration=calibration,
        reference=REFERENCE,
        warnings=[*runs[0].warnings,
                  *steal_warnings(every_validated, "window", cost_model.host_steal_slowdown,
                                  labels=_run_labels(len(validated), len(validated[0]))),
                  *queue_warnings([run.sensitivity for run in runs]),
                  *preemption_warnings(_by_window(calibration_runs, len(validated)),
                                       "calibration window"),
                  *preemption_warnings(validated, "window")],
    )


def _settling_warnings(windows: list[dict[str, Any]], until_std_error: float | None,
                       num_rounds: int) -> list[str]:
    """The windows whose pooled server means are noisy; with `until_std_error`, those that
    did not reach it in the rounds run."""
    if until_std_error is None:
        return noise_warnings(windows)
    if not (unsettled := noise_warnings(windows, 100.0 * until_std_error)):
        return []
    return [f"--until-std-error {100.0 * until_std_error:g}%: not reached "
            f"in {num_rounds} rounds (--num-repeats)", *unsettled]


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


def _run_labels(num_windows: int, num_repeats: int) -> list[str]:
    """Each validated run's name, window by window: "window K" (", run R" with repeats)."""
    return [f"window {window}" + (f", run {run}" if num_repeats > 1 else "")
            for window in range(1, num_windows + 1) for run in range(1, num_repeats + 1)]


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
