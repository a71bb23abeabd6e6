"""kvlab.fidelity: how far the simulator is from a real run, and fitting it to one.

Calibration fits the simulator's cost model to an engine's per-step profile, or to what a
benchmark client measured of any server (`from_bench`); validation runs
one trace through engine and simulator and compares them metric by metric; lockstep replays
the engine's measured step durations through the simulator, which must then make every memory
decision the engine made. Layer 4: above the simulator and the engine, below the CLI.
"""

from kvlab.fidelity.bridge import model_spec_for, sim_config_for
from kvlab.fidelity.calibration import fit_cost_model, format_fit, load_profiles
from kvlab.fidelity.from_bench import (
    BenchFit,
    bench_trace,
    fit_bench,
    format_bench_fit,
    reconstruct_profile,
    server_preset,
    server_serving,
    server_sim_config,
)
from kvlab.fidelity.lockstep import LOCKSTEP_COLUMNS, LockstepReport, lockstep
from kvlab.fidelity.validation import (
    METRICS,
    WINDOW_METRICS,
    ValidationResult,
    WindowRun,
    compare_metrics,
    relative_error,
    run_window,
    validate,
)

__all__ = [
    "LOCKSTEP_COLUMNS",
    "METRICS",
    "WINDOW_METRICS",
    "BenchFit",
    "LockstepReport",
    "ValidationResult",
    "WindowRun",
    "bench_trace",
    "compare_metrics",
    "fit_bench",
    "fit_cost_model",
    "format_bench_fit",
    "format_fit",
    "load_profiles",
    "lockstep",
    "model_spec_for",
    "reconstruct_profile",
    "relative_error",
    "run_window",
    "server_preset",
    "server_serving",
    "server_sim_config",
    "sim_config_for",
    "validate",
]
