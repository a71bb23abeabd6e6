"""Streamlit pieces the pages share: the sidebar setup, the policy editor, cached runs, charts
and tables with downloads, and the guard that turns user mistakes into messages."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from kvlab.dashboard.cluster_runs import ClusterView, cluster_view
from kvlab.dashboard.pagemap import PageMap, page_map_at
from kvlab.dashboard.runs import RunView, run_view
from kvlab.dashboard.setting_widgets import (
    choice_setting,
    number_setting,
    setting_help,
    switch_setting,
)
from kvlab.dashboard.workload import DEFAULT_TRACE, Setup, load_setup_trace
from kvlab.errors import KvlabError
from kvlab.policies import PolicySpec, registry
from kvlab.policies.serving import ServingConfig
from kvlab.specs import list_hardware, list_models
from kvlab.specs.kv_dtype import KV_CACHE_DTYPES
from kvlab.traces import DATASET_NAMES, Trace, bundled_traces

UPLOAD = "upload a file"
LOCAL_PATH = "a file on this machine"
SETUP_STATE = "kvlab_setup"
DEFAULT_POLICY = PolicySpec()
FAMILIES = (("block_sizing", "block sizing"), ("eviction", "eviction"),
            ("preemption", "preemption"), ("victim", "preemption victim"))


@contextmanager
def user_errors() -> Iterator[None]:
    """Show a KvlabError as an error message and stop the page (no traceback)."""
    try:
        yield
    except KvlabError as err:
        st.error(str(err))
        st.stop()


def sidebar_setup() -> Setup:
    """The workload and machine widgets (sidebar of every page); remembers the result."""
    side = st.sidebar
    side.header("Workload")
    names = [*bundled_traces(), UPLOAD, LOCAL_PATH]
    source = side.selectbox("Trace", names, index=names.index(DEFAULT_TRACE), key="trace",
                            help="a bundled excerpt of a real trace, or your own file")
    upload, name, dataset = None, source, "auto"
    if source in (UPLOAD, LOCAL_PATH):
        dataset = side.selectbox("Format", ["auto", *DATASET_NAMES[:-1]], key="trace_format",
                                 help="auto: .jsonl Mooncake, .json ShareGPT, .csv by its header")
        name, upload = _trace_file(source)
    num_prompts = side.number_input("Requests (first N; 0: all, as the CLI)", 0, 1_000_000, 0,
                                    key="num_prompts")
    arrivals = side.radio("Arrivals", ["replay timestamps", "Poisson at a rate"], key="arrivals",
                          horizontal=True)
    rate: float | None = None
    scale = 1.0
    if arrivals == "replay timestamps":
        scale = number_setting(side, "time_scale", 0.01, 1000.0, key="time_scale",
                               label="Time scale (x faster)")
    else:
        rate = number_setting(side, "request_rate", 0.01, 10_000.0, key="request_rate",
                              label="Request rate (req/s)", default=4.0)
    side.header("Machine")
    model = choice_setting(side, "model", list(list_models()), key="model", label="Model")
    device = choice_setting(side, "hardware", list(list_hardware()), key="hardware",
                            label="Hardware")
    tp = number_setting(side, "tensor_parallel_size", 1, 64, key="tp",
                        label="Tensor-parallel size")
    with side.expander("Scheduler limits"):
        serving = _serving_widgets()
    setup = Setup(trace=name, upload=upload, dataset_name=dataset,
                  num_prompts=int(num_prompts) or None,
                  request_rate=None if rate is None else float(rate),
                  time_scale=float(scale), model=model,
                  hardware=device, tensor_parallel_size=int(tp), serving=serving)
    st.session_state[SETUP_STATE] = setup
    return setup


def _serving_widgets() -> ServingConfig:
    """The serving config's widgets (each from its setting) and the config they set."""
    max_seqs = number_setting(st, "max_num_seqs", 1, 4096, key="max_num_seqs")
    max_tokens = number_setting(st, "max_num_batched_tokens", 16, 1_000_000,
                                key="max_num_batched_tokens")
    util = number_setting(st, "gpu_memory_utilization", 0.05, 1.0, key="gpu_util")
    kv_mib = st.number_input("KV cache MiB per device (0: from the utilisation)", 0,
                             10_000_000, 0, key="kv_cache_mib",
                             help=setting_help("kv_cache_memory_bytes"))
    kv_dtype = choice_setting(st, "kv_cache_dtype", list(KV_CACHE_DTYPES), key="kv_cache_dtype",
                              label="KV cache dtype")
    max_len = number_setting(st, "max_model_len", 0, 10_000_000, key="max_model_len",
                             label="max_model_len (0: the model's)", default=0)
    order = choice_setting(st, "scheduling_policy", registry.names("scheduling"),
                           key="scheduling_policy", default=ServingConfig().scheduling_policy)
    full_isl = switch_setting(st, "scheduler_reserve_full_isl", key="reserve_full_isl",
                              default=ServingConfig().scheduler_reserve_full_isl)
    return ServingConfig(max_num_seqs=int(max_seqs), max_num_batched_tokens=int(max_tokens),
                         gpu_memory_utilization=float(util),
                         kv_cache_memory_bytes=int(kv_mib) * 2**20 or None,
                         max_model_len=int(max_len) or None,
                         kv_cache_dtype=str(kv_dtype),
                         scheduling_policy=str(order),
                         scheduler_reserve_full_isl=bool(full_isl))


def _trace_file(source: str) -> tuple[str, bytes | None]:
    """(name, bytes) of the user's trace file; stops the page until one is given."""
    if source == UPLOAD:
        file = st.sidebar.file_uploader("Trace file", key="trace_upload")
        if file is None:
            st.info("Upload an Azure or BurstGPT .csv, Mooncake .jsonl or ShareGPT .json trace "
                    "in the sidebar.")
            st.stop()
        return file.name, file.getvalue()
    text = st.sidebar.text_input("Trace file path", key="trace_path").strip()
    if not text:
        st.info("Type the path of a trace file in the sidebar.")
        st.stop()
    path = Path(text).expanduser()
    if not path.is_file():
        st.error(f"{path}: no such file; expected a trace file (.csv, .jsonl or .json)")
        st.stop()
    return path.name, path.read_bytes()


def current_setup() -> Setup:
    """The setup the sidebar last produced (the default one before it ran)."""
    return st.session_state.get(SETUP_STATE, Setup())


def policy_editor(prefix: str) -> PolicySpec:
    """Widgets for the four policy families and their parameters, and the precision policy
    (a spec, as the policy grammar's `precision=` value); returns the spec."""
    helps = {(e.family, e.name): e.help for e in registry.entries()}
    cols = st.columns(4)
    kind = cols[0].selectbox("Allocation", ["paged", "contiguous", "buddy"], key=f"{prefix}_kind",
                             help="; ".join(f"{n}: {helps['allocation', n]}"
                                            for n in registry.names("allocation")))
    block_size = cols[1].selectbox("Page size (tokens)", [1, 2, 4, 8, 16, 32, 64, 128, 256],
                                   index=4, key=f"{prefix}_block_size")
    options: dict[str, object] = {}
    if kind == "contiguous":
        options["reserve"] = cols[2].selectbox("Reserve", registry.names("reserve"),
                                               key=f"{prefix}_reserve")
    watermark = cols[3].number_input("Watermark", 0.0, 0.99, DEFAULT_POLICY.watermark, step=0.01,
                                     key=f"{prefix}_watermark")
    cols = st.columns(4)
    for col, (family, label) in zip(cols, FAMILIES, strict=True):
        if family == "block_sizing" and kind == "contiguous":
            col.selectbox(label, ["fixed"], key=f"{prefix}_{family}", disabled=True,
                          help="contiguous reservation sizes by its reserve rule")
            continue
        choices = registry.names(family)
        options[family] = col.selectbox(
            label, choices, index=choices.index(getattr(DEFAULT_POLICY, family)),
            key=f"{prefix}_{family}",
            help="; ".join(f"{n}: {helps[family, n]}" for n in choices))
    precision = st.text_input(
        "Precision", DEFAULT_POLICY.precision, key=f"{prefix}_precision",
        help="none, or a policy with its parameters, e.g. age:recent=64,depth=2 ("
        + "; ".join(f"{n}: {helps['precision', n]}" for n in registry.names("precision")) + ")")
    options["precision"] = precision.strip() or "none"
    with user_errors():
        spec = PolicySpec(kind=kind, block_size=int(block_size), watermark=float(watermark),
                          **options)  # type: ignore[arg-type]
    st.caption(f"policy: `{spec.to_string()}`")
    return spec


@st.cache_data(show_spinner="Loading trace…", max_entries=16)
def cached_trace(key: str, _setup: Setup) -> Trace:
    """The setup's trace (cached by the setup's key)."""
    return load_setup_trace(_setup)


@st.cache_data(show_spinner="Simulating…", max_entries=64)
def cached_run(key: str, policy: str, slos: tuple[tuple[str, float], ...],
               _setup: Setup) -> RunView:
    """A simulated run (cached by setup key, policy and SLOs)."""
    return run_view(cached_trace(key, _setup), _setup, policy, dict(slos))


@st.cache_data(show_spinner="Simulating the cluster…", max_entries=32)
def cached_cluster(key: str, policy: str, num_instances: int, router: str, router_seed: int,
                   _setup: Setup) -> ClusterView:
    """A simulated cluster run (cached by setup key, policy, instances and router)."""
    return cluster_view(cached_trace(key, _setup), _setup, policy, num_instances, router,
                        router_seed)


@st.cache_data(show_spinner="Replaying to the chosen step…", max_entries=32)
def cached_page_map(key: str, policy: str, step_id: int, start_s: float, duration_s: float,
                    _setup: Setup) -> PageMap:
    """The page map at one step of a run (cached)."""
    return page_map_at(cached_trace(key, _setup), _setup.config(policy), step_id, start_s,
                       duration_s)


def chart(fig: go.Figure, key: str) -> None:
    """A Plotly chart with PNG (the camera button) and interactive HTML downloads."""
    st.plotly_chart(fig, key=key, config={"toImageButtonOptions": {"format": "png",
                                                                   "filename": key}})
    st.download_button("Download HTML", data=lambda: fig.to_html(include_plotlyjs=True),
                       file_name=f"{key}.html", mime="text/html", key=f"{key}_html",
                       on_click="ignore", type="tertiary", icon=":material/download:")


def table(frame: pd.DataFrame, key: str, *, height: int | None = None) -> None:
    """A data table with a CSV download."""
    st.dataframe(frame, hide_index=True, height=height or "auto", key=key)
    st.download_button("Download CSV", data=lambda: frame.to_csv(index=False),
                       file_name=f"{key}.csv", mime="text/csv", key=f"{key}_csv",
                       on_click="ignore", type="tertiary", icon=":material/download:")
