"""One run of a sweep: checked settings -> the simulation `kvlab sim` would run with the same
flags -> one flat row (the whole summary, the parameters, the seed, the run's CPU time).

`run_point` is what every executor sends to its workers: it never raises for a failed run, it
returns the row with the error instead, so that one bad point never stops a sweep.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Mapping
from typing import Any

from kvlab.errors import KvlabError
from kvlab.metrics import (
    RunResult,
    count_good_requests,
    parse_metric_percentiles,
    parse_percentile_metrics,
    summarize,
)
from kvlab.policies import parse_policy
from kvlab.policies.serving import ServingConfig
from kvlab.policies.serving_presets import serving_preset
from kvlab.policies.tiers import AUTO_BLOCK, TiersConfig, parse_tiers
from kvlab.sim import SimConfig, simulate, simulate_cluster, summarize_cluster
from kvlab.sim.disaggregation import parse_pd
from kvlab.specs import DEFAULT_HARDWARE, DEFAULT_MODEL
from kvlab.sweep.settings import SETTINGS, run_key
from kvlab.sweep.trace_cache import cached_trace
from kvlab.traces import Trace, load_trace
from kvlab.traces.arrivals import apply_arrivals, check_arrival_options, ramp_up_from

# Row columns that are not the summary's: first in every row.
KEY_COLUMN, STATUS_COLUMN, ERROR_COLUMN = "run_key", "status", "error"
PARAM_PREFIX = "param."
# Columns that measure this machine, not the simulation: they differ between two runs of the
# same point (and between executors); everything else in a row is deterministic.
TIMING_COLUMNS = ("run_cpu_s",)
ATTAINMENT_COLUMN = "slo_attainment"  # the share of all requests meeting every SLO (goodput)
# Summary values that are bags of varying keys: kept as JSON text, so that every run of a sweep
# has the same columns (`failed_reasons` names each run's own failure causes).
JSON_KEYS = ("failed_reasons",)
_SERVING_KEYS = ("policy", "block_size", "enable_prefix_caching", "preset")
_RAMP_UP_KEYS = ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")
_ARRIVAL_KEYS = ("request_rate", "burstiness", "time_scale")
_TRACE_ARGUMENTS = ("num_prompts", "length_scale", "seed")


def _group(settings: Mapping[str, Any], group: str) -> dict[str, Any]:
    return {name: value for name, value in settings.items() if SETTINGS[name].group == group}


def sim_config(settings: Mapping[str, Any]) -> SimConfig:
    """The SimConfig of checked settings, as `kvlab sim` builds it from the same flags; unset
    settings keep the library's defaults (`kvlab sim`'s)."""
    machine = {"model": DEFAULT_MODEL, "hardware": DEFAULT_HARDWARE,
               **_group(settings, "machine")}  # `kvlab sim`'s defaults
    return SimConfig(serving=serving_config(settings), **machine)


def serving_config(settings: Mapping[str, Any]) -> ServingConfig:
    """The ServingConfig of read settings (the CLI's flags build theirs here too): the policy's
    own keys (eviction, ...) are applied over `policy`, then `block_size` and
    `enable_prefix_caching` as the flags do; the settings and policy keys left unset take the
    `preset`'s values (kvlab.policies.serving_presets; the default, vllm, is the library's
    defaults)."""
    text = settings.get("policy", "paged")
    keys = _group(settings, "policy")
    serving = {k: v for k, v in _group(settings, "serving").items() if k not in _SERVING_KEYS}
    policy = serving_preset(settings.get("preset")).apply(text, parse_policy(text), serving,
                                                         named=keys)
    if keys:
        policy = policy.with_options(**keys)
    if "seed" in settings:
        serving["seed"] = settings["seed"]
    tiers = tiers_config(settings)
    return ServingConfig.create(
        policy,
        block_size=settings.get("block_size"),
        enable_prefix_caching=bool(settings.get("enable_prefix_caching", False)) or bool(tiers),
        kv_tiers=tiers,
        **serving,
    )


def tiers_config(settings: Mapping[str, Any]) -> TiersConfig:
    """The memory tiers of checked settings (none unless `kv_tiers` names some), as the
    `--kv-tier*` flags build them; tiers turn prefix caching on, as the flags do."""
    tiers = _group(settings, "tiers")
    text = tiers.pop("kv_tiers", "")
    options = {"write_policy": tiers.pop("kv_tier_write", "write-back"),
               "store_threshold": tiers.pop("kv_tier_store_threshold", 0),
               "overlap": tiers.pop("kv_tier_overlap", "none"),
               "block_size": tiers.pop("kv_tier_block_size", AUTO_BLOCK)}
    return TiersConfig(parse_tiers(text), **options)


def load_settings_trace(settings: Mapping[str, Any]) -> Trace:
    """The trace of checked settings, as `kvlab sim` loads it from the same flags. The file's
    trace before its arrivals are set is kept for the process's next runs that read it again
    (`kvlab.sweep.trace_cache`: a grid over rates or time scales, a `tune` bisection)."""
    trace = _group(settings, "trace")
    ramp_up = ramp_up_from(*(trace.pop(name, None) for name in _RAMP_UP_KEYS))
    arrivals = {name: trace.pop(name) for name in _ARRIVAL_KEYS if name in trace}
    check_arrival_options(arrivals.get("request_rate"), arrivals.get("burstiness", 1.0),
                          arrivals.get("time_scale", 1.0))
    # (load_trace with its arrival defaults returns the file's trace, which apply_arrivals
    # then shapes as load_trace itself would)
    loaded = cached_trace(trace, lambda: _load_trace(trace))
    return apply_arrivals(loaded, seed=trace.get("seed", 0), ramp_up=ramp_up, **arrivals)


def _load_trace(trace: dict[str, Any]) -> Trace:
    trace = dict(trace)
    arguments = {name: trace.pop(name) for name in _TRACE_ARGUMENTS if name in trace}
    dataset_name = trace.pop("dataset_name", None)  # (None: read from the file)
    path = trace.pop("dataset_path", None)
    options = {name: value for name, value in trace.items() if value is not None}
    return load_trace(dataset_name, path, **arguments, **options)


def summary_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`kvlab.metrics.summarize`'s keyword arguments from checked settings (its defaults,
    `kvlab sim`'s, where unset)."""
    options: dict[str, Any] = {}
    if "percentile_metrics" in settings:
        options["percentile_metrics"] = parse_percentile_metrics(settings["percentile_metrics"])
    if "metric_percentiles" in settings:
        options["metric_percentiles"] = parse_metric_percentiles(settings["metric_percentiles"])
    options["goodput_slos"] = settings.get("goodput")
    return options


def simulate_settings(settings: Mapping[str, Any]) -> tuple[RunResult, dict[str, Any]]:
    """Simulate checked settings; the run's records and its summary (with num_instances > 1,
    the whole cluster's: `summarize_cluster`, its per-instance summaries a JSON column)."""
    config = sim_config(settings)  # a bad combination fails before the trace loads
    cluster = _group(settings, "cluster")
    pd = cluster.pop("pd", None)
    if pd == "none":  # a grid's row without disaggregation
        pd = None
    if pd is not None:  # as `kvlab sim --pd P:D`: P + D instances
        cluster["pd"] = parse_pd(pd)
    bandwidth = cluster.pop("pd_link_bandwidth", None)
    if bandwidth is not None:
        cluster["pd_link_bandwidth"] = bandwidth * 1e9
    if cluster.get("num_instances", 1) > 1 or pd is not None:  # as `kvlab sim`
        run = simulate_cluster(load_settings_trace(settings), config, **cluster)
        return run.cluster, summarize_cluster(run, **summary_options(settings))
    result = simulate(load_settings_trace(settings), config)
    return result, summarize(result, **summary_options(settings))


def flatten(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A summary as one flat row: nested objects become `outer.inner` columns, lists and the
    bags of `JSON_KEYS` JSON text."""
    row: dict[str, Any] = {}
    for key, value in summary.items():
        name = prefix + key
        if key in JSON_KEYS or isinstance(value, (list, tuple)):
            row[name] = json.dumps(value, sort_keys=True)
        elif isinstance(value, dict):
            row.update(flatten(value, name + "."))
        else:
            row[name] = value
    return row


def point_row(settings: Mapping[str, Any], status: str, error: str | None) -> dict[str, Any]:
    """A row's first columns: the run key, status and error, the seed and the parameters."""
    row: dict[str, Any] = {KEY_COLUMN: run_key(settings), STATUS_COLUMN: status,
                           ERROR_COLUMN: error, "seed": settings.get("seed", 0)}
    for name, value in settings.items():
        if SETTINGS[name].group == "summary":
            value = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
        row[PARAM_PREFIX + name] = value
    return row


def run_point(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate one point of a sweep and return its row; a failure is a row with status
    `error` and the error's one-line message (a KvlabError's text, or the exception's type,
    text and innermost frame for a bug), never an exception."""
    start = time.process_time()
    try:
        result, summary = simulate_settings(settings)
        attainment = _attainment(result, settings)
    except KvlabError as err:
        row = point_row(settings, "error", str(err))
    except Exception as err:  # a bug in one run must not stop the others; its row says where
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
        row = point_row(settings, "error", f"{type(err).__name__}: {err}{where}")
    else:
        row = point_row(settings, "ok", None)
        row.update(flatten(summary))
        row["seed"] = settings.get("seed", 0)
        if attainment is not None:
            row[ATTAINMENT_COLUMN] = attainment
    row["run_cpu_s"] = time.process_time() - start
    return row


def _attainment(result: RunResult, settings: Mapping[str, Any]) -> float | None:
    """The share of requests meeting the goodput SLOs (of the `slo_class` only, when set);
    None without SLOs."""
    goodput = settings.get("goodput")
    if not goodput:
        return None
    good, total = count_good_requests(result, goodput, settings.get("slo_class"))
    return good / total if total else 0.0


def error_row(settings: Mapping[str, Any], message: str) -> dict[str, Any]:
    """The row of a run that never returned (its worker died): status `error`, the message."""
    row = point_row(settings, "error", message)
    row["run_cpu_s"] = None
    return row
