"""One validated window of a server validation: the simulator's runs of the server's
benchmarks of it (one per repeat, each under the steal measured during it), how far its
metrics move with the server's speed, and its report (simulator against server, its repeats
pooled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.bench import BenchResult
from kvlab.fidelity.from_bench import bench_trace, steal_share
from kvlab.fidelity.server_pooling import pooled_server_summary, repeat_spread, summarize_run
from kvlab.fidelity.validation import WINDOW_METRICS, compare_metrics
from kvlab.metrics import RunResult, merge_runs
from kvlab.sim import SimConfig, simulate
from kvlab.sim.calibrated import CalibratedCostModel

REFERENCE = "server"
# `speed_sensitivity` simulates each window again with every step this much longer and shorter.
SPEED_STEP = 0.05


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
    base = summarize_run(merge_runs(list(sims)))
    slow, fast = (summarize_run(merge_runs(simulate_window(benches, config,
                                                           cost_model.scaled(1.0 + step))))
                  for step in (SPEED_STEP, -SPEED_STEP))
    moves: dict[str, float | None] = {}
    for key in WINDOW_METRICS:
        centre, high, low = base.get(key), slow.get(key), fast.get(key)
        moves[key] = (None if centre is None or high is None or low is None or not centre
                      else (high - low) / centre / (2.0 * SPEED_STEP))
    return moves


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
        "metrics": compare_metrics(summarize_run(merge_runs(run.sims)), server,
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
