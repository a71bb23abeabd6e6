"""Small runs and tables shared by the dashboard tests."""

from functools import cache

import pandas as pd

from kvlab.dashboard.runs import RunView, run_view
from kvlab.dashboard.workload import Setup, load_setup_trace
from kvlab.policies.serving import ServingConfig

# A cache small enough that requests queue and get preempted: every chart has something to show.
SMALL = Setup(num_prompts=120, time_scale=8.0, serving=ServingConfig(gpu_memory_utilization=0.2))
SWAP_POLICY = "paged:preemption=swap"


def small_setup(**changes) -> Setup:
    """The shared small setup with some fields changed."""
    setup = SMALL
    for name, value in changes.items():
        setup = setup.with_value(name, value)
    return setup


@cache
def small_view(policy: str = SWAP_POLICY) -> RunView:
    """120 Azure requests at 8x speed on a small KV cache (cached; do not mutate)."""
    return run_view(load_setup_trace(SMALL), SMALL, policy)


def step_table(**columns) -> pd.DataFrame:
    """A per-step table of three steps with every memory column zero unless given."""
    base = {name: [0, 0, 0] for name in (
        "num_live_token_slots", "num_internal_frag_slots", "num_cached_free_pages",
        "num_free_pages", "num_used_pages", "num_running", "num_waiting", "num_swapped",
        "num_preempted", "num_swap_out_pages", "num_swap_in_pages", "step_id")}
    base["start_s"] = [0.0, 1.0, 2.0]
    base["duration_s"] = [1.0, 1.0, 1.0]
    base.update(columns)
    return pd.DataFrame(base)


def small_sweep_folder(path, **grid):
    """A kvlab sweep folder of 20-request runs over `grid`."""
    from kvlab.sweep import SerialExecutor, SweepSpec, SweepStore, run_sweep

    spec = SweepSpec.create({"num_prompts": 20, "time_scale": 8.0}, grid)
    run_sweep(spec.points(), SweepStore(path), SerialExecutor())
    return path
