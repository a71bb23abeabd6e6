"""How far the simulator is from the real engine: one trace through both, metric by metric, and
lockstep mode, where the simulator replays the engine's measured step durations and must make
every memory decision the engine made.

The simulated instance is built from the engine itself (`sim_config_for`): the same policy
(host pages included), page count, model length and batch limits; under preemption=auto it is
also given the engine's measured swap and recompute costs, so both ask the same question with
the same numbers. The simulator's clock is a calibrated cost model, fitted on a separate
calibration run unless one is given (see `validate`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from kvlab.calibration import fit_cost_model
from kvlab.errors import KvlabError
from kvlab.metrics import RunResult, merge_runs, per_step_table, summarize
from kvlab.policies.records import INT_COLUMNS
from kvlab.sim import SimConfig, simulate
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.specs import ModelSpec

if TYPE_CHECKING:
    from kvlab.engine.config import EngineConfig
    from kvlab.engine.engine import LLMEngine
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
    ("Prefix cache hit rate (%)", "prefix_cache_hit_rate"),
    ("Mean KV cache usage (%)", "mean_kv_usage_perc"),
    ("Peak KV cache usage (%)", "peak_kv_usage_perc"),
)
# The targets' metrics, shown for each window when there are several.
WINDOW_METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
# Step columns lockstep compares: the clock, and every count and memory figure.
LOCKSTEP_COLUMNS = ("start_s", "duration_s", *INT_COLUMNS)
MIN_CALIBRATION_STEPS = 8
# CPU time an engine runs before `run_engines` may switch to another. The first step after a
# switch runs on caches the other engine filled and costs more; with one step per turn the
# engine with fewer steps met that on every step and the other on a third of them (a 4% bias
# between calibration and validated run at 4 ms steps). Turns of tens of steps make that cost
# small and equal, and are still far shorter than the machine's changes of speed.
TURN_S = 0.1


class ReplayedStepTimes:
    """A cost model that charges each simulated step the duration the engine measured for the
    step of the same index (memory work included, so swaps and copies cost nothing extra).

    Past the engine's last step it charges 0 and counts the extra steps: lockstep reports
    them as a divergence instead of stopping the simulation.
    """

    def __init__(self, durations_s: Sequence[float], preemption_costs: Any = None) -> None:
        self._durations_s = list(durations_s)
        self._next = 0
        self._costs = preemption_costs
        self.num_extra_steps = 0

    def step_time_s(self, shape: object) -> float:
        """The engine's measured duration of the next step."""
        index = self._next
        self._next += 1
        if index < len(self._durations_s):
            return self._durations_s[index]
        self.num_extra_steps += 1
        return 0.0

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        """0 on the link (the measured duration holds it); under preemption=auto the manager
        is given the engine's measured costs instead of this model."""
        return 0.0

    def copy_time_s(self, num_pages: int) -> float:
        """0 (inside the measured duration)."""
        return 0.0

    def recompute_time_s(self, num_tokens: int) -> float:
        """Only asked under preemption=auto, which gets the engine's costs; linear otherwise."""
        return float(num_tokens)


@dataclass(slots=True)
class LockstepReport:
    """Whether the simulator replaying measured durations matched the engine step for step.

    `first_step` is the index of the first step whose `columns` differ (None when identical);
    `engine_row` and `sim_row` hold those columns' values there. `request_mismatch` describes
    the first request whose outcome differs when the steps all agree.
    """

    identical: bool
    num_engine_steps: int
    num_sim_steps: int
    first_step: int | None = None
    columns: list[str] = field(default_factory=list)
    engine_row: dict[str, Any] = field(default_factory=dict)
    sim_row: dict[str, Any] = field(default_factory=dict)
    request_mismatch: str | None = None
    window: int | None = None  # of several validated windows: the one that diverged (from 1)

    def describe(self) -> str:
        """One line for the report."""
        if self.identical:
            return f"identical ({self.num_engine_steps} steps, every request)"
        where = "" if self.window is None else f"window {self.window}: "
        if self.first_step is None:
            return f"{where}steps identical, requests differ: {self.request_mismatch}"
        diffs = ", ".join(
            f"{name} engine={self.engine_row.get(name)} sim={self.sim_row.get(name)}"
            for name in self.columns
        )
        return (
            f"{where}DIVERGED at step {self.first_step} (engine {self.num_engine_steps} steps, "
            f"sim {self.num_sim_steps}): {diffs}"
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


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

    def to_json(self) -> dict[str, Any]:
        """The saved document: metrics, lockstep verdict, cost model, both summaries, and the
        windows when there were several."""
        document = {
            "metrics": self.metrics,
            "lockstep_identical": None if self.lockstep is None else self.lockstep.identical,
            "lockstep": None if self.lockstep is None else self.lockstep.to_json(),
            "calibration": self.calibration,
            "cost_model": self.cost_model.to_json(),
            "policy": self.engine_summary.get("policy"),
            "engine": self.engine_summary,
            "sim": self.sim_summary,
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


def model_spec_for(engine: LLMEngine) -> ModelSpec:
    """The engine's model as a simulator ModelSpec (its shape, length limit and size)."""
    config = engine.model_config
    num_params = float(sum(p.numel() for p in engine.model.parameters()))
    dtype_bytes = engine.kv_cache.k_caches[0].element_size()
    return ModelSpec(
        name=str(engine.config.model),
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        max_model_len=engine.max_model_len,
        num_params=num_params,
        num_active_params=num_params,
        dtype_bytes=dtype_bytes,
    )


def sim_config_for(engine: LLMEngine) -> SimConfig:
    """A SimConfig that simulates exactly this engine's memory and scheduler."""
    policy = engine.policy
    if policy.preemption != "recompute" and policy.host_pages != engine.manager.num_host_pages:
        policy = policy.with_options(host_pages=engine.manager.num_host_pages)
    config = engine.config
    return SimConfig(
        model=model_spec_for(engine),
        hardware="cpu",  # unused: the page count is given and the clock is calibrated
        policy=policy,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=engine.max_model_len,
        num_gpu_blocks_override=engine.num_pages,
        enable_chunked_prefill=config.enable_chunked_prefill,
        seed=config.seed,
    )


def run_engine(
    config: EngineConfig, trace: Trace, on_step: Callable[[int], object] | None = None
) -> tuple[RunResult, LLMEngine, Trace]:
    """A fresh engine from `config` serving `trace` on the virtual clock; returns the run, the
    engine and the trace with the prompt ids it ran (synthesised from the config's seed) and
    the output ids it sampled.
    `on_step` is told after every step how many requests it ended (a progress bar's update)."""
    return run_engines(config, [trace], on_step)[0]


def run_engines(
    config: EngineConfig,
    traces: Sequence[Trace],
    on_step: Callable[[int], object] | None = None,
) -> list[tuple[RunResult, LLMEngine, Trace]]:
    """One fresh engine per trace, all built from `config`, stepped in turns (`TURN_S` of CPU
    time) on their virtual clocks: next is the engine that has spent the least time per request
    of its trace so far, so that runs of different sizes start and end together.

    Their steps interleave over the same stretch of real time, so every run meets the same
    machine: on a shared or virtual CPU the speed of a core can change by tens of percent from
    one second to the next (other tenants, other processes), and two runs taken one after the
    other can each meet a different machine. Each engine measures only its own steps. All the
    engines are alive at once: on an accelerator their KV caches must fit together. `on_step`
    is told after every step of any engine how many requests it ended.
    """
    from kvlab.engine.engine import LLMEngine, frozen_heap
    from kvlab.engine.replay import (
        synthesize_prompt_ids,
        trace_requests,
        trace_result,
        with_outputs,
    )

    engines = [LLMEngine(config) for _ in traces]
    ran = [
        synthesize_prompt_ids(trace, engine.model_config.vocab_size, config.seed)
        for trace, engine in zip(traces, engines, strict=True)
    ]
    runs = [
        engine.iter_run(trace_requests(engine, trace), replay="fast")
        for engine, trace in zip(engines, ran, strict=True)
    ]
    spent_s = [0.0] * len(runs)
    shares = [max(len(trace), 1) for trace in ran]
    done: dict[int, Any] = {}
    with frozen_heap():
        while len(done) < len(runs):
            index = min(
                (i for i in range(len(runs)) if i not in done),
                key=lambda i: spent_s[i] / shares[i],
            )
            turn_end_s = spent_s[index] + TURN_S
            while index not in done:  # at least one step, then until the turn is used
                started = time.thread_time()
                try:
                    num_ended = next(runs[index])
                except StopIteration as stop:
                    done[index], num_ended = stop.value, 0
                spent_s[index] += time.thread_time() - started
                if on_step is not None:
                    on_step(num_ended)
                if spent_s[index] >= turn_end_s:
                    break
    return [
        (trace_result(engine, trace, done[i], "fast"), engine,
         with_outputs(trace, done[i].requests))
        for i, (engine, trace) in enumerate(zip(engines, ran, strict=True))
    ]


def split_windows(
    trace: Trace, num_prompts: int, num_calibration: int, num_windows: int
) -> list[tuple[Trace, Trace]]:
    """`num_windows` consecutive (validated, calibration) pairs: window k validates
    `num_prompts` requests and calibrates on the `num_calibration` after them; the next window
    starts after those. Arrivals are shifted as a whole: a validated excerpt's to start where
    the trace starts, a calibration excerpt's to start at 0."""
    stride = num_prompts + num_calibration
    needed = stride * num_windows
    if len(trace) < needed:
        raise KvlabError(
            f"{trace.name} has {len(trace)} requests; {num_windows} window(s) of "
            f"{num_prompts} validated and {num_calibration} calibration requests need {needed}"
        )
    origin = trace.requests[0].arrival_s if len(trace) else 0.0
    pairs = []
    for index in range(num_windows):
        start = index * stride
        head = trace.requests[start : start + num_prompts]
        tail = trace.requests[start + num_prompts : start + stride]
        number = f" {index + 1}" if num_windows > 1 else ""
        validated = _excerpt(trace, head, f"{trace.name} (window{number})" if number else
                             trace.name, origin)
        calibration = _excerpt(trace, tail, f"{trace.name} (calibration window{number})")
        pairs.append((validated, calibration))
    return pairs


def _excerpt(trace: Trace, requests: Sequence[Any], name: str, origin: float = 0.0) -> Trace:
    """`requests` as a trace of their own, arrivals shifted so the first is at `origin`."""
    shift = (requests[0].arrival_s - origin) if requests else 0.0
    moved = [dataclasses.replace(r, arrival_s=r.arrival_s - shift) for r in requests]
    return dataclasses.replace(trace, name=name, requests=moved)


def calibrate_on(result: RunResult, source: str) -> CalibratedCostModel:
    """Fit a cost model to an engine run's own step profile (its first, warm-up step left out)."""
    profile = per_step_table(result)
    if len(profile) < MIN_CALIBRATION_STEPS:
        raise KvlabError(
            f"the calibration run ({source}) took {len(profile)} steps, too few to fit a cost "
            f"model (at least {MIN_CALIBRATION_STEPS}); give more requests, or --cost-model FILE"
        )
    return fit_cost_model(profile, sources=[source], skip_first_steps=1)


def relative_error(sim: float, engine: float) -> float | None:
    """(sim - engine) / |engine|; 0 when both are 0; None (undefined) when only engine is 0."""
    if engine == 0:
        return 0.0 if sim == 0 else None
    return (sim - engine) / abs(engine)


def compare_metrics(sim: dict[str, Any], engine: dict[str, Any]) -> dict[str, dict]:
    """{key: {"sim", "engine", "rel_error"}} for every validated metric."""
    table = {}
    for _, key in METRICS:
        s, e = float(sim[key]), float(engine[key])
        table[key] = {"sim": s, "engine": e, "rel_error": relative_error(s, e)}
    return table


def lockstep(
    engine_result: RunResult, trace: Trace, config: SimConfig, preemption_costs: Any = None
) -> LockstepReport:
    """Replay the engine's measured step durations through the simulator and compare every
    step's clock, counts and memory, then every request's outcome.

    `trace` must carry the prompt ids the engine ran and the outputs it sampled (they decide
    prefix-cache hits), as `run_engine` returns it.
    """
    engine_cols = engine_result.steps.columns
    replay = ReplayedStepTimes(engine_cols["duration_s"], preemption_costs)
    sim_result = simulate(trace, config, cost_model=replay, preemption_costs=preemption_costs)
    sim_cols = sim_result.steps.columns
    num_engine, num_sim = len(engine_result.steps), len(sim_result.steps)
    report = LockstepReport(True, num_engine, num_sim)
    for index in range(max(num_engine, num_sim)):
        if index >= num_engine or index >= num_sim:
            report.identical, report.first_step, report.columns = False, index, ["num_steps"]
            report.engine_row, report.sim_row = {"num_steps": num_engine}, {"num_steps": num_sim}
            return report
        differing = [n for n in LOCKSTEP_COLUMNS if engine_cols[n][index] != sim_cols[n][index]]
        if differing:
            report.identical, report.first_step, report.columns = False, index, differing
            report.engine_row = {n: engine_cols[n][index] for n in differing}
            report.sim_row = {n: sim_cols[n][index] for n in differing}
            return report
    mismatch = _request_mismatch(engine_result, sim_result)
    if mismatch is not None:
        report.identical, report.request_mismatch = False, mismatch
    return report


def _request_mismatch(engine: RunResult, sim: RunResult) -> str | None:
    """The first request whose status, preemptions, cache hits or token stamps differ."""

    def outcome(r: Any) -> tuple:
        return (r.status, r.num_preemptions, r.num_swaps_out, r.num_cached_tokens,
                r.first_token_s, r.finish_s)

    sims = {r.request_id: r for r in sim.requests}
    for request in engine.requests:
        other = sims.get(request.request_id)
        if other is None:
            return f"request {request.request_id} is missing from the simulation"
        if outcome(request) != outcome(other):
            return f"request {request.request_id}: engine {outcome(request)}, sim {outcome(other)}"
    if not np.array_equal(engine.itls_s, sim.itls_s):
        return "inter-token latencies differ"
    return None


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
    calibration = "given"
    if cost_model is None and not calibrate_on_same_run:
        if calibration_trace is None or not len(calibration_trace):
            raise KvlabError(
                "no calibration: give --cost-model FILE, a calibration window with requests, "
                "or --calibrate-on-same-run"
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


def format_validation(result: ValidationResult) -> str:
    """The metric table (simulator, engine, relative error) and the lockstep verdict."""
    width = 28 + 3 * 13
    lines = [
        " Simulator vs engine ".center(width, "="),
        f"{'Policy:':<28}{result.engine_summary.get('policy')}",
        f"{'Calibration:':<28}{result.calibration}",
        f"{'Metric':<28}{'sim':>13}{'engine':>13}{'rel. error':>13}",
        "-" * width,
    ]
    for label, key in METRICS:
        row = result.metrics[key]
        lines.append(f"{label:<28}{_number(row['sim']):>13}{_number(row['engine']):>13}"
                     f"{_percent(row['rel_error']):>13}")
    if result.windows:
        lines.append("-" * width)
        lines.append("Each window's error (output throughput, mean TTFT, mean TPOT):")
        for number, window in enumerate(result.windows, start=1):
            errors = ", ".join(
                _percent(window["metrics"][key]["rel_error"]) for key in WINDOW_METRICS
            )
            lines.append(f"  window {number} ({window['num_prompts']} requests): {errors}")
    if result.lockstep is not None:
        lines.append("-" * width)
        lines.append(f"{'Lockstep:':<28}{result.lockstep.describe()}")
    lines.append("=" * width)
    return "\n".join(lines)


def _percent(error: float | None) -> str:
    return "n/a" if error is None else f"{100.0 * error:+.1f}%"


def _number(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isfinite(value) and value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.2f}"
