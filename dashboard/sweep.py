"""Sweep page: a grid over one or two parameters run here, or the rows of a `kvlab sweep`
folder, shown as a heatmap of a chosen metric over categorical axes."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kvlab.dashboard import figures
from kvlab.dashboard.runs import (
    SWEEP_PARAMETERS,
    load_sweep_folder,
    numeric_metrics,
    parse_values,
    sweep,
)
from kvlab.dashboard.widgets import chart, current_setup, table, user_errors
from kvlab.dashboard.workload import Setup
from kvlab.errors import KvlabError
from kvlab.policies import parse_policy

RESULT = "sweep_result"
RUN_HERE, READ_FOLDER = "run a grid here", "read a kvlab sweep folder"
NONE = "(none)"
DEFAULT_VALUES = {"block_size": "8,16,32", "request_rate": "2,4,8", "time_scale": "1,2,4",
                  "watermark": "0,0.01,0.05", "max_num_seqs": "64,128,256",
                  "max_num_batched_tokens": "2048,4096,8192", "tensor_parallel_size": "1,2,4",
                  "gpu_memory_utilization": "0.5,0.7,0.9", "eviction": "lru,fifo,lfu",
                  "preemption": "recompute,swap", "victim": "last-arrived,longest,fewest-pages",
                  "block_sizing": "fixed,geometric",
                  "precision": "none,age:recent=128,age:recent=32,depth=2",
                  "kv_tiers": "none,host:64GiB,host:256GiB,host:1TiB",
                  "kv_tier_block_size": "none,256,auto"}
MAX_POINTS = 64


def main() -> None:
    """Render the Sweep page."""
    st.title("kvlab · Sweep parameters")
    source = st.radio("Source", [RUN_HERE, READ_FOLDER], key="sweep_source", horizontal=True,
                      help="run a small grid here, or chart the rows of `kvlab sweep`")
    if source == READ_FOLDER:
        _read_folder()
        return
    setup = current_setup()
    policy_text = st.text_input("Base policy", "paged", key="sweep_policy",
                                help="the swept parameters override it")
    names = list(SWEEP_PARAMETERS)
    cols = st.columns(2)
    x = cols[0].selectbox("X parameter", names, index=names.index("block_size"), key="sweep_x")
    x_text = cols[0].text_input("X values", DEFAULT_VALUES[x], key=f"sweep_x_values_{x}")
    y_name = cols[1].selectbox("Y parameter", [NONE, *names], index=names.index("request_rate")
                               + 1, key="sweep_y")
    y = None if y_name == NONE else y_name
    y_text = cols[1].text_input("Y values", DEFAULT_VALUES[y], key=f"sweep_y_values_{y}") \
        if y else ""
    st.caption("request_rate resamples arrivals as Poisson; eviction, preemption, victim, "
               "block_sizing and precision take policy names (`kvlab policies`); values are "
               "read as `kvlab sweep --grid` reads them (kv_tier_block_size needs kv_tiers "
               "in the grid or the sidebar's setup); the other "
               "setup fields come from the sidebar. Larger grids, any `kvlab sim` flag, a "
               "process pool or Ray: `kvlab sweep`, then read its folder here.")
    clicked = st.button("Run", key="sweep_run", type="primary")
    if clicked:
        with user_errors():
            grid = _run(setup, policy_text, x, x_text, y, y_text)
        st.session_state[RESULT] = (x, y, grid)
    if RESULT not in st.session_state:
        st.info("Press **Run** to simulate every point of the grid.")
        return
    x, y, grid = st.session_state[RESULT]
    _show(grid, x, y, [x, *([y] if y else [])])


def _read_folder() -> None:
    """Chart a `kvlab sweep` folder: X and Y among the parameters it varies, the others fixed
    at a chosen value each."""
    path = st.text_input("Sweep folder", "", key="sweep_folder",
                         help="the --output folder of `kvlab sweep` (a Parquet dataset)")
    if not path:
        st.info("Give the folder `kvlab sweep` wrote (e.g. sweep.parquet).")
        return
    with user_errors():
        frame, axes = load_sweep_folder(path)
    failed = frame[frame["status"] == "error"] if "status" in frame else frame.iloc[:0]
    st.caption(f"{len(frame)} rows, {len(failed)} failed; parameters varied: "
               f"{', '.join(axes) or 'none'}")
    if not axes:
        table(frame, "sweep_folder_table")
        return
    cols = st.columns(2)
    x = cols[0].selectbox("X parameter", axes, key="sweep_folder_x")
    others = [a for a in axes if a != x]
    y_name = cols[1].selectbox("Y parameter", [NONE, *others], key="sweep_folder_y",
                               index=1 if others else 0)
    y = None if y_name == NONE else y_name
    chosen = frame
    for name in (a for a in others if a != y):
        values = sorted(frame[name].astype(str).unique())
        value = st.selectbox(f"{name} (fixed)", values, key=f"sweep_folder_fix_{name}")
        chosen = chosen[chosen[name].astype(str) == value]
    _show(chosen, x, y, axes)


def _show(grid: pd.DataFrame, x: str, y: str | None, parameters: list[str]) -> None:
    """The heatmap of a chosen metric over x (and y), categorical axes, and the rows."""
    metrics = numeric_metrics(grid, exclude=[*parameters, "run_cpu_s", "seed"])
    if not metrics:
        st.warning("No run succeeded: nothing to chart (the errors are in the table).")
        table(grid, "sweep_table")
        return
    default = metrics.index("request_throughput") if "request_throughput" in metrics else 0
    metric = st.selectbox("Metric", metrics, index=default, key="sweep_metric")
    errors = grid["error"].dropna() if "error" in grid else pd.Series(dtype=object)
    if len(errors):
        st.warning(f"{len(errors)} runs failed; the first: {errors.iloc[0]}")
    chart(figures.heatmap_figure(grid, x, y, metric), "sweep_heatmap")
    table(grid, "sweep_table")


def _run(setup: Setup, policy_text: str, x: str, x_text: str, y: str | None,
         y_text: str) -> pd.DataFrame:
    """Check the grid, then simulate it with a progress bar."""
    policy = parse_policy(policy_text)
    x_values = parse_values(x, x_text)
    y_values = parse_values(y, y_text) if y else []
    if y == x:
        raise KvlabError(f"X and Y are both {x}; choose two different parameters or Y (none)")
    num_points = len(x_values) * max(len(y_values), 1)
    if num_points > MAX_POINTS:
        raise KvlabError(f"the grid has {num_points} points; the dashboard runs at most "
                         f"{MAX_POINTS} (use kvlab sweep for larger grids)")
    bar = st.progress(0.0, text=f"0 of {num_points} points")
    grid = sweep(setup, policy, x, x_values, y, y_values,
                 on_point=lambda done, total: bar.progress(done / total,
                                                           text=f"{done} of {total} points"))
    bar.empty()
    return grid


if __name__ == "__main__":
    main()
