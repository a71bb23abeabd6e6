"""How far the simulator is from the real engine: one trace through both, metric by metric,
window by window, with lockstep (`kvlab.fidelity.lockstep`) when asked for.

The simulated instance is built from the engine itself (`sim_config_for`): the same policy
(host pages included), page count, model length and batch limits; under preemption=auto it is
also given the engine's measured swap and recompute costs, so both ask the same question with
the same numbers. The simulator's clock is a calibrated cost model, fitted on a separate
calibration run unless one is given (see `validate`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from kvlab.errors import KvlabError
from kvlab.fidelity.bridge import sim_config_for
from kvlab.fidelity.calibration import fit_cost_model
from kvlab.fidelity.lockstep import LockstepReport, lockstep
from kvlab.metrics import RunResult, merge_runs, per_step_table, summarize
from kvlab.metrics.precision_mix import mix_rows
from kvlab.sim import simulate
from kvlab.sim.calibrated import CalibratedCostModel

if TYPE_CHECKING:
    from kvlab.engine.config import EngineConfig
    from kvlab.traces import Trace

# (printed label, summary key), in the order of the table.
METRICS = (
    ("Output throughput (tok/s)", "output_throughput"),
    ("Request throughput (req/s)", "request_throughput"),
    ("Mean TTFT (ms)", "mean_ttft_ms"),
    ("Median TTFT (ms)", "median_ttft_ms"),
    ("P99 TTFT (ms)", "p99_ttft_ms"),
    ("Mean TPOT (ms)", "mean_tpot_ms"),
    ("Median TPOT (ms)", "median_tpot_ms"),
    ("P99 TPOT (ms)", "p99_tpot_ms"),
    ("Mean E2EL (ms)", "mean_e2el_ms"),
    ("Median E2EL (ms)", "median_e2el_ms"),
    ("P99 E2EL (ms)", "p99_e2el_ms"),
    ("Preemptions", "num_preemptions"),
    ("Swap-outs (requests)", "num_swaps_out"),
    ("Swap-ins (requests)", "num_swaps_in"),
    ("Prefix cache hit rate (%)", "prefix_cache_hit_rate_perc"),
    ("Mean KV cache usage (%)", "mean_kv_usage_perc"),
    ("Peak KV cache usage (%)", "peak_kv_usage_perc"),
)
# The targets' metrics, shown for each window when there are several.
WINDOW_METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
MIN_CALIBRATION_STEPS = 8


@dataclass(slots=True)
class ValidationResult:
    """A validation's outcome: per-metric sim/engine/relative error, both summaries, the cost
    model used and how it was obtained, and the lockstep report when asked for."""

    metrics: dict[str, dict[str, float | None]]
    engine_summary: dict[str, Any]
    sim_summary: dict[str, Any]
    cost_model: CalibratedCostModel
    calibration: str
    lockstep: LockstepReport | None = None
    # With several windows: each one's metrics, calibration and cost model (the fields above
    # then pool the windows' requests; cost_model is the first window's).
    windows: list[dict[str, Any]] = field(default_factory=list)
    # What the simulator is compared with: "engine" (kvlab's, `validate`) or "server" (any
    # server, `validate_server`; engine_summary is then the server's): the rows' key.
    reference: str = "engine"
    warnings: list[str] = field(default_factory=list)

    @property
    def policy(self) -> str | None:
        """The policy compared: the engine's, or, against a server that does not say its
        own, the one the simulator ran for it (the `vllm` preset's)."""
        return self.engine_summary.get("policy") or self.sim_summary.get("policy")

    def to_json(self) -> dict[str, Any]:
        """The saved document: metrics, lockstep verdict, cost model, both summaries, and the
        windows when there were several."""
        document: dict[str, Any] = {
            "metrics": self.metrics,
            "lockstep_identical": None if self.lockstep is None else self.lockstep.identical,
            "lockstep": None if self.lockstep is None else self.lockstep.to_json(),
            "calibration": self.calibration,
            "cost_model": self.cost_model.to_json(),
            "policy": self.policy,
            "reference": self.reference,
            self.reference: self.engine_summary,
            "sim": self.sim_summary,
            "warnings": self.warnings,
        }
        if self.windows:
            document["windows"] = self.windows
        return document


@dataclass(slots=True)
class WindowRun:
    """One validated window: the engine's and the simulator's runs of the same requests, the
    cost model the simulator used and how it was obtained, and the lockstep report."""

    engine: RunResult
    sim: RunResult
    cost_model: CalibratedCostModel
    calibration: str
    lockstep: LockstepReport | None


def calibrate_on(result: RunResult, source: str) -> CalibratedCostModel:
    """Fit a cost model to an engine run's own step profile (its first, warm-up step left out)."""
    profile = per_step_table(result)
    if len(profile) < MIN_CALIBRATION_STEPS:
        raise KvlabError(
            f"the calibration run ({source}) took {len(profile)} steps, too few to fit a cost "
            f"model (at least {MIN_CALIBRATION_STEPS}); give more requests, or cost_model FILE",
            parameters=("cost_model",),
        )
    return fit_cost_model(profile, sources=[source], skip_first_steps=1)


def relative_error(sim: float, engine: float) -> float | None:
    """(sim - engine) / |engine|; 0 when both are 0; None (undefined) when only engine is 0."""
    if engine == 0:
        return 0.0 if sim == 0 else None
    return (sim - engine) / abs(engine)


def compare_metrics(sim: dict[str, Any], measured: dict[str, Any],
                    reference: str = "engine") -> dict[str, dict]:
    """{key: {"sim", reference, "rel_error"}} for every validated metric (`METRICS`, then the
    precision mix's rows where the simulator ran a precision policy: `precision_rows`); a
    metric the measured side does not report (a server's swaps, its precision mix) is None
    with no error."""
    table = {}
    for _, key in (*METRICS, *precision_rows(sim)):
        value = measured.get(key)
        s = float(sim[key])
        m = None if value is None else float(value)
        table[key] = {"sim": s, reference: m,
                      "rel_error": None if m is None else relative_error(s, m)}
    return table


def precision_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(printed label, summary key) of a run's precision mix (`mix_rows`) that validation
    compares: each level's share of the pages and the pages demoted into it, and demotions
    per second (the ballast a ledger owed is the run's own bookkeeping)."""
    return [(label, key) for label, key in mix_rows(summary)
            if key != "precision_max_debt_pages"]


def _summarize(result: RunResult) -> dict[str, Any]:
    return summarize(
        result, percentile_metrics=("ttft", "tpot", "itl", "e2el"), metric_percentiles=(50, 99)
    )


def validate(
    config: EngineConfig,
    windows: Sequence[tuple[Trace, Trace | None]],
    *,
    cost_model: CalibratedCostModel | None = None,
    calibrate_on_same_run: bool = False,
    with_lockstep: bool = False,
    interleave_calibration: bool = True,
    progress: bool = False,
) -> ValidationResult:
    """Serve each window's trace on the engine and simulate it with a calibrated cost model
    (`run_window`), then compare the pooled requests of all windows (`merge_runs`): means over
    every request, throughputs over all the time served. With several windows each keeps its
    own metrics in `ValidationResult.windows`; `split_windows` cuts a trace into windows.

    Why windows: a short window's mean TTFT turns on a few queueing events (one preemption
    more or less moves it by tens of percent), and one longer window at the same rate only
    builds a longer queue; independent windows, each calibrated on the requests after it,
    average those events out the way more requests would. `progress` shows a bar of the
    requests the engine runs have served (validated and calibration) on stderr.
    """
    separate = cost_model is None and not calibrate_on_same_run
    total = sum(len(trace) + (len(cal or ()) if separate else 0) for trace, cal in windows)
    bar = tqdm(total=total, unit="req", desc="engine runs", leave=False, disable=not progress)
    with bar:
        runs = [
            run_window(
                config,
                trace,
                cost_model=cost_model,
                calibration_trace=calibration_trace,
                calibrate_on_same_run=calibrate_on_same_run,
                with_lockstep=with_lockstep,
                interleave_calibration=interleave_calibration,
                on_step=bar.update,
            )
            for trace, calibration_trace in windows
        ]
    engine_summary = _summarize(_pooled([run.engine for run in runs]))
    sim_summary = _summarize(_pooled([run.sim for run in runs]))
    result = ValidationResult(
        metrics=compare_metrics(sim_summary, engine_summary),
        engine_summary=engine_summary,
        sim_summary=sim_summary,
        cost_model=runs[0].cost_model,
        calibration=runs[0].calibration,
        lockstep=None if not with_lockstep else _combined_lockstep(runs),
    )
    if len(runs) > 1:
        result.calibration = f"each window its own; window 1: {runs[0].calibration}"
        result.windows = [_window_json(run) for run in runs]
    return result


def run_window(
    config: EngineConfig,
    trace: Trace,
    *,
    cost_model: CalibratedCostModel | None = None,
    calibration_trace: Trace | None = None,
    calibrate_on_same_run: bool = False,
    with_lockstep: bool = False,
    interleave_calibration: bool = True,
    on_step: Callable[[int], object] | None = None,
) -> WindowRun:
    """The engine's and the simulator's runs of `trace`.

    The cost model is `cost_model` if given; else fitted on an engine run of
    `calibration_trace` (other requests, a fresh engine), stepped in turn with the validated
    run (`run_engines`) unless `interleave_calibration` is False (then it runs first); else,
    only with `calibrate_on_same_run`, on the validated run's own profile (optimistic: the model
    has seen the very steps it is judged on). `with_lockstep` also replays the run's measured
    durations. `on_step` is passed to the engine runs (`run_engines`).
    """
    from kvlab.engine.interleave import run_engine, run_engines  # torch: only when run

    calibration = "given"
    if cost_model is None and not calibrate_on_same_run:
        if calibration_trace is None or not len(calibration_trace):
            raise KvlabError(
                "no calibration: give cost_model FILE, a calibration window with requests, "
                "or calibrate_on_same_run",
                parameters=("cost_model", "calibrate_on_same_run"),
            )
        if interleave_calibration:
            (calibration_run, _, _), (engine_result, engine, ran) = run_engines(
                config, [calibration_trace, trace], on_step
            )
        else:
            calibration_run, _, _ = run_engine(config, calibration_trace, on_step)
            engine_result, engine, ran = run_engine(config, trace, on_step)
        cost_model = calibrate_on(calibration_run, calibration_trace.name)
        calibration = (
            f"separate run{', interleaved' if interleave_calibration else ', before'}: "
            f"{calibration_trace.name}, {len(calibration_trace)} requests"
        )
    else:
        engine_result, engine, ran = run_engine(config, trace, on_step)
    if cost_model is None:
        cost_model = calibrate_on(engine_result, trace.name)
        calibration = "same run (optimistic)"
    sim_config = sim_config_for(engine)
    costs = engine.preemption_costs
    sim_result = simulate(ran, sim_config, cost_model=cost_model, preemption_costs=costs)
    sim_result.metadata["hardware"] = f"sim of {engine.device_name}"
    report = lockstep(engine_result, ran, sim_config, costs) if with_lockstep else None
    return WindowRun(engine_result, sim_result, cost_model, calibration, report)


def _pooled(results: Sequence[RunResult]) -> RunResult:
    """The windows' runs merged, described as the first window and how many more."""
    merged = merge_runs(results)
    if len(results) > 1:
        first = results[0].metadata.get("dataset")
        merged.metadata["dataset"] = f"{first} and {len(results) - 1} more windows"
    return merged


def _combined_lockstep(runs: Sequence[WindowRun]) -> LockstepReport:
    """Identical when every window was (steps added up); else the first window that was not."""
    for number, run in enumerate(runs, start=1):
        assert run.lockstep is not None
        if not run.lockstep.identical:
            if len(runs) > 1:
                return dataclasses.replace(run.lockstep, window=number)
            return run.lockstep
    return LockstepReport(
        True,
        sum(run.lockstep.num_engine_steps for run in runs if run.lockstep is not None),
        sum(run.lockstep.num_sim_steps for run in runs if run.lockstep is not None),
    )


def _window_json(run: WindowRun) -> dict[str, Any]:
    """One window's part of the saved document."""
    return {
        "dataset": run.engine.metadata.get("dataset"),
        "num_prompts": len(run.engine.requests),
        "calibration": run.calibration,
        "cost_model": run.cost_model.to_json(),
        "metrics": compare_metrics(_summarize(run.sim), _summarize(run.engine)),
        "lockstep_identical": None if run.lockstep is None else run.lockstep.identical,
    }


