"""kvlab.sweep: sweeps and tuning over simulations, on a local process pool or a Ray cluster.

A sweep is a `SweepSpec` (settings shared by every run, a grid of values, an optional random
sample), expanded into points; `run_sweep` runs the points not yet stored on an executor
(`make_executor`: `local` or `ray`) and appends one row per run (the flat summary, the
parameters, the seed, or the error) to a Parquet dataset (`SweepStore`) that
`pandas.read_parquet(folder)` reads. `tune` finds, for each candidate, the highest request rate
that meets SLOs. Layer 4: imports the simulator and the layers below it; Ray only when chosen.
"""

from kvlab.sweep.drive import SweepReport, points_to_run, run_points, run_sweep
from kvlab.sweep.executors import (
    EXECUTORS,
    Executor,
    PoolExecutor,
    SerialExecutor,
    default_workers,
    make_executor,
)
from kvlab.sweep.grid import SweepSpec, load_sweep_file, parse_grid_item, split_values
from kvlab.sweep.runner import (
    PARAM_PREFIX,
    TIMING_COLUMNS,
    flatten,
    run_point,
    sim_config,
    simulate_settings,
)
from kvlab.sweep.settings import SETTINGS, Setting, check_settings, run_key, setting_value
from kvlab.sweep.store import SweepStore
from kvlab.sweep.tune import DEFAULT_MIN_ATTAINMENT, RateSearch, SearchOptions, save_table, tune

__all__ = [
    "DEFAULT_MIN_ATTAINMENT",
    "EXECUTORS",
    "PARAM_PREFIX",
    "SETTINGS",
    "TIMING_COLUMNS",
    "Executor",
    "PoolExecutor",
    "RateSearch",
    "SearchOptions",
    "SerialExecutor",
    "Setting",
    "SweepReport",
    "SweepSpec",
    "SweepStore",
    "check_settings",
    "default_workers",
    "flatten",
    "load_sweep_file",
    "make_executor",
    "parse_grid_item",
    "points_to_run",
    "run_key",
    "run_point",
    "run_points",
    "run_sweep",
    "save_table",
    "setting_value",
    "sim_config",
    "simulate_settings",
    "split_values",
    "tune",
]
