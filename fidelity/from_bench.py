"""Calibrate the simulator from a `kvlab bench serve` run against any server: fit the cost
model so that the simulator, run on the same requests with the server's configuration,
reproduces what the client measured.

Two sources of evidence, in two stages:

1. per-step durations reconstructed from the streaming timestamps (`reconstruct_profile`):
   every running request receives a token at each step's end, so the chunks that arrive
   together are one step; a step's requests, with the prompts it must have prefilled under the
   token budget (chunked prefill, first come first served), give its features, and the gap
   since the previous step its duration. `fit_cost_model` fits these as it fits an engine's
   measured profile.
2. the per-request latency distributions: the simulator runs the benchmark's requests (their
   actual send times and output lengths) and a Nelder-Mead search scales the step, prefill and
   decode coefficients to bring its TTFT, TPOT, ITL and E2EL (means and medians) and its
   duration to the client's (`refine`).

The server's API latency (what it adds between the client and its scheduler) is measured, not
searched, where the server exports vLLM's TTFT histogram: per scrape interval, the client's
mean TTFT less the server's, fitted as a line in the requests in flight (`api_latency_fit`).
Then, as a last step, the latency inside the server that neither that difference nor the steps
show (its front end handing a request to its engine and the first token back) is added to it:
the server's mean TTFT less its queue and prefill times, less the simulated wait for the
running step, where it exports those histograms; else the median, over the calibration
requests, of the client's TTFT less the simulated one (`in_server_latency`). Both latencies
together are a request's way in at most: stage 1 is then fitted again on the steps that the
engine cannot have spent waiting for a request on that way (`reconstruct_profile`'s
`intake_s`).

What a client cannot see is left to the simulator: prefix hits shorten prefills it
reconstructs as whole, and a preempted request's recompute is not attributed (steps where a
running request is missing are left out of stage 1; stage 2 sees them through the latencies).

The rooms: `bench_server.py` (the server's configuration and the run as a trace),
`bench_steps.py` (steps reconstructed from the streamed timestamps), `bench_latency.py` (the
API and in-server latencies), `bench_tuning.py` (the tuning constants), and this module, the
fit. The names of those rooms stay importable from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvlab.errors import KvlabError
from kvlab.fidelity.bench_latency import (
    ApiLatency,
    api_latency,
    api_latency_fit,
    engine_intake_overhead,
    in_server_latency,
    latency_by_load,
    mean_boundary_wait,
    median_ttft_residual,
    theil_sen,
)
from kvlab.fidelity.bench_server import (
    VLLM_NULL_BLOCKS,
    VLLM_POLICY,
    VLLM_SCHEDULER,
    bench_trace,
    served_request,
    server_preset,
    server_serving,
    server_sim_config,
    server_step_count,
    steal_share,
    steal_warnings,
)
from kvlab.fidelity.bench_steps import group_steps, reconstruct_profile, regular_steps
from kvlab.fidelity.bench_tuning import (
    BENCH_TERMS,
    BENCH_TERMS_KVLAB,
    FIRST_DECODES,
    GAP_FRACTIONS,
    GROUPS,
    INTAKE_PASSES,
    INTAKE_TOLERANCE_S,
    LATE_MEMBER_FRACTION,
    LATENCY_STEP_S,
    MATCHED_METRICS,
    MIN_BENT_GAIN,
    MIN_LATENCY_INTERVALS,
    MIN_LOAD_SPREAD,
    MIN_STEAL_SPREAD,
    POOR_FIT_ERROR,
    READ_TOGETHER_FRACTION,
    STEAL_SLOWDOWNS,
    STEAL_WARNING_PERC,
    STEP_PRIOR_WEIGHT,
    SUMMARY_OPTIONS,
    THEIL_SEN_POINTS,
)
from kvlab.fidelity.calibration import (
    TIME_COLUMN,
    FitQuality,
    finite_or_none,
    fit_quality,
    predict,
    robust_step_fit,
)
from kvlab.fidelity.optimize import nelder_mead
from kvlab.fidelity.validation import relative_error
from kvlab.metrics import summarize
from kvlab.sim import SimConfig, simulate
from kvlab.sim.calibrated import CalibratedCostModel

if TYPE_CHECKING:
    from kvlab.bench import BenchResult
    from kvlab.metrics import RunResult

__all__ = [
    "BENCH_TERMS", "BENCH_TERMS_KVLAB", "FIRST_DECODES", "GAP_FRACTIONS", "GROUPS",
    "INTAKE_PASSES", "INTAKE_TOLERANCE_S", "LATENCY_STEP_S", "LATE_MEMBER_FRACTION",
    "MATCHED_METRICS", "MIN_BENT_GAIN", "MIN_LATENCY_INTERVALS", "MIN_LOAD_SPREAD",
    "MIN_STEAL_SPREAD", "POOR_FIT_ERROR", "READ_TOGETHER_FRACTION", "STEAL_SLOWDOWNS",
    "STEAL_WARNING_PERC", "STEP_PRIOR_WEIGHT", "SUMMARY_OPTIONS", "THEIL_SEN_POINTS",
    "VLLM_NULL_BLOCKS", "VLLM_POLICY", "VLLM_SCHEDULER", "ApiLatency", "BenchFit",
    "api_latency", "api_latency_fit", "bench_trace", "bent_step_fit", "engine_intake_overhead",
    "fit_bench", "format_bench_fit", "group_steps", "in_server_latency", "latency_by_load",
    "mean_boundary_wait", "median_ttft_residual", "reconstruct_profile", "regular_steps",
    "served_request", "server_preset", "server_serving", "server_sim_config",
    "server_step_count", "steal_share", "steal_step_fit", "steal_warnings", "step_error",
    "theil_sen",
]


@dataclass(slots=True)
class BenchFit:
    """A cost model fitted to a bench run, how well the simulator then reproduces the run
    (`errors`: matched metric -> relative error, sim vs client) and what to beware of."""

    cost_model: CalibratedCostModel
    errors: dict[str, float | None]
    stage1_errors: dict[str, float | None]
    num_steps: int
    num_steps_server: int | None
    warnings: list[str] = field(default_factory=list)
    stage1: CalibratedCostModel | None = None  # the step fit alone, before stage 2


class _Runs:
    """The bench runs fitted together, on the simulated instance `config`: their steps
    (stage 1, `step_fit`) and their simulations under a model (`simulate`, `errors`)."""

    def __init__(self, runs: list[BenchResult], config: SimConfig, source: str) -> None:
        self.runs, self.config, self.source = runs, config, source
        self.measured = [run.summary(**SUMMARY_OPTIONS) for run in runs]
        completed = sum(m["completed"] for m in self.measured)
        if completed < 2:
            raise KvlabError(f"{source}: {completed} request(s) completed; calibrating needs "
                             "a run with more")
        self.shares = [steal_share(run) for run in runs]
        self.terms = BENCH_TERMS_KVLAB if server_preset(runs[0].server) == "kvlab" \
            else BENCH_TERMS
        self.latency = api_latency_fit(runs, self.measured)
        self.traces: list = []
        # the last model simulated, and its simulations
        self._last: list[tuple[CalibratedCostModel, list[RunResult]]] = []

    def step_fit(self, intake_s: float) -> tuple[list[pd.DataFrame], pd.DataFrame,
                                                 CalibratedCostModel]:
        """Stage 1 on the steps the way in (`intake_s`) cannot have held: each run's steps,
        the regular ones pooled, and the model fitted on them with the API latency."""
        profiles, regular = regular_steps(self.runs, self.config.serving, self.shares,
                                          intake_s, self.source)
        return profiles, regular, dataclasses.replace(
            steal_step_fit(regular, self.terms), api_latency_s=self.latency.base_s,
            api_latency_per_request_s=self.latency.per_request_s)

    def simulate(self, model: CalibratedCostModel) -> list[RunResult]:
        """Each run simulated under `model` (slowed by its steal share)."""
        # (a model is often simulated again at once: measured for the way in, then judged;
        # judged, then stage 2's starting point; without stage 2, judged, then measured)
        if self._last and self._last[0][0] == model:
            return self._last[0][1]
        sims = [simulate(trace, self.config, cost_model=model.under_steal(share))
                for trace, share in zip(self.traces, self.shares, strict=True)]
        self._last[:] = [(model, sims)]
        return sims

    def errors(self, model: CalibratedCostModel) -> list[dict[str, float | None]]:
        """Each run's matched metrics' relative errors, simulated under `model`."""
        out = []
        for sim, target in zip(self.simulate(model), self.measured, strict=True):
            simulated = summarize(sim, **SUMMARY_OPTIONS)
            out.append({key: relative_error(float(simulated[key]), float(target[key]))
                        for key, _ in MATCHED_METRICS})
        return out


def fit_bench(results: BenchResult | Sequence[BenchResult], config: SimConfig, *,
              refine: bool = True, max_evaluations: int = 80,
              source: str = "bench") -> BenchFit:
    """Stage 1 then (with `refine`) stage 2, on the simulated instance `config`, over one
    bench run or several of the same server (their steps pooled in stage 1, each run
    simulated on its own in stage 2, the losses added)."""
    runs = _Runs([results] if not isinstance(results, Sequence) else list(results), config,
                 source)
    latency = runs.latency
    profiles, regular, stage1 = runs.step_fit(0.0)
    runs.traces = [bench_trace(run) for run in runs.runs]
    intake_s = 0.0
    # The way in measured: the steps the engine may have waited for it are left out, and
    # stage 1 fitted again (else they hold the wait, and the latency added at the end counts
    # it twice: 18-33% too long a TTFT, measured). Measured again on that fit: the wait the
    # steps held is then no longer taken off it (the TTFT residuals' case).
    for _ in range(INTAKE_PASSES if latency.measured else 0):
        way_in_s = latency.base_s + in_server_latency(runs.runs, runs.simulate(stage1),
                                                      stage1)[0]
        if way_in_s < intake_s + INTAKE_TOLERANCE_S:
            break
        try:
            profiles, regular, stage1 = runs.step_fit(way_in_s)
        except KvlabError:  # too few steps left: the fit before stands
            break
        intake_s = way_in_s
    stage1_errors = _mean_errors(runs.errors(stage1))
    model, errors, evaluations = stage1, stage1_errors, 0
    if refine:
        model, run_errors, evaluations = _refine(stage1, runs.errors, max_evaluations,
                                                 fit_latency=not latency.measured)
        errors = _mean_errors(run_errors)
    unseen, unseen_from = 0.0, None
    if latency.measured:  # (else stage 2 searched the latency on the TTFTs already)
        unseen, unseen_from = in_server_latency(runs.runs, runs.simulate(model), model)
        model = dataclasses.replace(model, api_latency_s=max(0.0, model.api_latency_s + unseen))
        errors = _mean_errors(runs.errors(model))
    steps = sum(len(p) for p in profiles)
    counted = [server_step_count(run) for run in runs.runs]
    server_steps = None if None in counted else sum(c for c in counted if c is not None)
    quality = _dedicated_quality(model, regular)
    model = dataclasses.replace(model, fit={
        "sources": [source], "num_runs": len(runs.runs), "num_steps": quality.num_steps,
        "num_memory_steps": 0, "skip_first_steps": 1,
        "method": "bench: reconstructed steps, then simulator in the loop"
        if refine else "bench: reconstructed steps", "refine_evaluations": evaluations,
        "r2": finite_or_none(quality.r2), "mape_perc": finite_or_none(quality.mape_perc),
        "total_error_perc": finite_or_none(quality.total_error_perc),
        "num_reconstructed_steps": steps, "num_server_steps": server_steps,
        "host_steal_perc": [round(100.0 * share, 2) for share in runs.shares],
        "in_server_latency_s": unseen, "in_server_latency_from": unseen_from,
        "intake_s": intake_s, "sim_errors": errors, "server": runs.runs[0].server.to_json(),
        "model": config.model_spec.name,
    })
    warnings = [*_warnings(errors, steps, server_steps),
                *steal_warnings(runs.runs, "calibration run", model.host_steal_slowdown)]
    return BenchFit(model, errors, stage1_errors, steps, server_steps, warnings, stage1=stage1)


def _dedicated_quality(model: CalibratedCostModel, regular: pd.DataFrame) -> FitQuality:
    """`fit_quality` of the model on the steps as the dedicated host the coefficients describe
    would run them (each step's time less its run's steal slowdown)."""
    dedicated = regular[TIME_COLUMN] / (1.0 + model.host_steal_slowdown * regular["steal_share"])
    return fit_quality(model, regular.assign(**{TIME_COLUMN: dedicated}))


def steal_step_fit(profile: pd.DataFrame, terms: Sequence[str]) -> CalibratedCostModel:
    """`robust_step_fit` of the steps as a dedicated host would run them: each step's time
    divided by 1 + k x its run's `steal_share`, with the slowdown k (STEAL_SLOWDOWNS) whose
    fit, slowed down again, best matches the measured steps (`step_error`), and the knee of
    the bent decode term that `bent_step_fit` finds in the steps as measured. k is the
    model's `host_steal_slowdown`; 0 where the runs' steal shares differ by less than
    MIN_STEAL_SPREAD (nothing tells k then)."""
    bent = bent_step_fit(profile, terms)
    shares = profile["steal_share"].to_numpy(dtype=np.float64)
    measured = profile[TIME_COLUMN].to_numpy(dtype=np.float64)
    if not (measured > 0).any() or float(np.ptp(shares)) < MIN_STEAL_SPREAD:
        return bent
    best, best_error = CalibratedCostModel(), math.inf
    for slowdown in STEAL_SLOWDOWNS:
        factor = 1.0 + slowdown * shares
        model = robust_step_fit(profile.assign(**{TIME_COLUMN: measured / factor}), terms,
                                first_decodes=bent.first_decodes)
        error = step_error(predict(model, profile) * factor, measured)
        if error < best_error:
            best, best_error = dataclasses.replace(model, host_steal_slowdown=slowdown), error
    return best


def bent_step_fit(profile: pd.DataFrame, terms: Sequence[str]) -> CalibratedCostModel:
    """`robust_step_fit` on `terms`, with the bent decode term at the knee of FIRST_DECODES
    whose steps are nearest the measured ones (`step_error`) where that error is at least
    MIN_BENT_GAIN below the line's; else the line. Why: a CPU server's steps can grow faster
    over their first decodes than after (kvlab serve's own steps: a line made steps of 1-2
    decodes 51-70% too long and those of 16-64 up to 11% too short), and a line fitted to
    them puts light windows' TPOT high and busy ones' low."""
    measured = profile[TIME_COLUMN].to_numpy(dtype=np.float64)
    line = robust_step_fit(profile, terms)
    best, best_error = line, step_error(predict(line, profile), measured)
    threshold = (1.0 - MIN_BENT_GAIN) * best_error
    for first_decodes in FIRST_DECODES:
        model = robust_step_fit(profile, terms, first_decodes=first_decodes)
        error = step_error(predict(model, profile), measured)
        if error <= threshold and error < best_error:
            best, best_error = model, error
    return best


def step_error(predicted: np.ndarray, measured: np.ndarray) -> float:
    """The mean relative error of predicted step times, each step's capped at 100% (steps
    measured as 0 s left out; inf where none is left)."""
    positive = measured > 0
    if not positive.any():
        return math.inf
    relative = np.abs(predicted - measured)[positive] / measured[positive]
    return float(np.mean(np.minimum(relative, 1.0)))


def _mean_errors(per_run: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each matched metric's error averaged over the runs (None where none has one)."""
    out: dict[str, float | None] = {}
    for key, _ in MATCHED_METRICS:
        values = [v for e in per_run if (v := e.get(key)) is not None]
        out[key] = float(np.mean(values)) if values else None
    return out


def _refine(start: CalibratedCostModel,
            errors_of: Callable[[CalibratedCostModel], list[dict[str, float | None]]],
            max_evaluations: int, *,
            fit_latency: bool) -> tuple[CalibratedCostModel, list[dict[str, float | None]], int]:
    """Stage 2: log-scale factors on GROUPS and, with `fit_latency`, an additive change of the
    API latency (in units of LATENCY_STEP_S), Nelder-Mead on the weighted squared log-ratio of
    the matched metrics plus a pull towards stage 1 (STEP_PRIOR_WEIGHT). Why not always the
    latency: where the server measured it, moving it to fit busy runs' TTFT (a step model's
    error) put light runs' TTFT 15-30% high."""
    groups = [names for names in GROUPS.values()
              if any(getattr(start, name) > 0 for name in names)]
    cache: dict[tuple[float, ...], tuple[float, list[dict[str, float | None]]]] = {}

    def scaled(x: np.ndarray) -> CalibratedCostModel:
        changes: dict[str, Any] = {
            name: getattr(start, name) * math.exp(float(factor))
            for names, factor in zip(groups, x[:len(groups)], strict=True) for name in names}
        if fit_latency:
            changes["api_latency_s"] = max(0.0, start.api_latency_s
                                           + LATENCY_STEP_S * float(x[-1]))
        return dataclasses.replace(start, **changes)

    def loss(x: np.ndarray) -> float:
        key = tuple(np.round(x, 6))
        if key not in cache:
            errors = errors_of(scaled(x))
            prior = STEP_PRIOR_WEIGHT * len(errors) * float(np.sum(x[:len(groups)] ** 2))
            cache[key] = (sum(_loss(e) for e in errors) + prior, errors)
        return cache[key][0]

    best = nelder_mead(loss, np.zeros(len(groups) + fit_latency), step=0.3,
                       max_evaluations=max_evaluations)
    return scaled(best.x), cache[tuple(np.round(best.x, 6))][1], best.num_evaluations


def _loss(errors: dict[str, float | None]) -> float:
    total = 0.0
    for key, weight in MATCHED_METRICS:
        error = errors.get(key)
        if error is not None:
            total += weight * math.log(max(1.0 + error, 1e-3)) ** 2
    return total


def _warnings(errors: dict[str, float | None], num_steps: int,
              server_steps: int | None) -> list[str]:
    out = []
    for key, error in errors.items():
        if error is not None and abs(error) > POOR_FIT_ERROR:
            out.append(f"poor fit: the simulator's {key} is {100 * error:+.1f}% off the "
                       "client's measurement")
    if server_steps and abs(num_steps - server_steps) > 0.2 * server_steps:
        out.append(f"the streamed timestamps gave {num_steps} steps where the server counted "
                   f"{server_steps}: chunks of one step arrived apart (a loaded client?)")
    return out


def format_bench_fit(fit: BenchFit) -> str:
    """The coefficients, the step fit, the simulator's error on each matched metric before
    and after stage 2, and the warnings, as `kvlab calibrate --from-bench` prints them."""
    from kvlab.fidelity.calibration import format_fit

    lines = [format_fit(fit.cost_model)]
    server = "n/a" if fit.num_steps_server is None else str(fit.num_steps_server)
    lines.append(f"{'Steps reconstructed (server counted):':<40}{fit.num_steps} ({server})")
    lines.append(f"{'Simulator vs client':<28}{'step fit':>12}{'final':>12}")
    for key, _ in MATCHED_METRICS:
        before, after = fit.stage1_errors.get(key), fit.errors.get(key)
        lines.append(f"  {key:<26}{_percent(before):>12}{_percent(after):>12}")
    lines.extend(f"warning: {text}" for text in fit.warnings)
    return "\n".join(lines)


def _percent(error: float | None) -> str:
    return "n/a" if error is None else f"{100.0 * error:+.1f}%"
