"""Small sweeps shared by the sweep tests."""

import os

import pandas as pd

from kvlab.sweep import TIMING_COLUMNS, SweepSpec, run_point

# 40 Azure conversation requests at 8x their rate: a few hundredths of a second a run
SMALL = {"num_prompts": 40, "time_scale": 8.0}


def small_spec(**grid) -> SweepSpec:
    """The small workload with a grid."""
    return SweepSpec.create(SMALL, grid)


def comparable(frame: pd.DataFrame) -> list[dict]:
    """A sweep's rows without the columns that measure this machine, sorted by run key: two
    executors' results compare equal."""
    frame = frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])
    frame = frame.sort_values("run_key").reset_index(drop=True)
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def die_on_fifo(settings):
    """`run_point`, except that the worker process dies on eviction fifo."""
    if settings.get("eviction") == "fifo":
        os._exit(3)
    return run_point(settings)
