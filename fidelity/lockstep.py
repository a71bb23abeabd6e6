"""Lockstep: the simulator replays the engine's measured step durations and must make every
decision the engine made, step for step; any difference is a bug."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from kvlab.metrics import INT_COLUMNS, RunResult
from kvlab.sim import SimConfig, simulate
from kvlab.sim.replayed import ReplayedStepTimes

if TYPE_CHECKING:
    from kvlab.traces import Trace

# Step columns lockstep compares: the clock, and every count and memory figure.
LOCKSTEP_COLUMNS = ("start_s", "duration_s", *INT_COLUMNS)


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
