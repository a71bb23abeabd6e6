"""Simulated clusters as the Routers page shows them (`ClusterView`): one router's run on N
instances as tables, and the routers side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvlab.dashboard.workload import Setup
from kvlab.errors import KvlabError
from kvlab.sim import simulate_cluster, summarize_cluster
from kvlab.sim.cluster_result import cluster_step_table
from kvlab.traces import Trace

PERCENTILES = (50, 90, 99)
MAX_INSTANCES = 16
# The router table's columns, after `router`
ROUTER_COLUMNS = ("prefix_cache_hit_rate_perc", "request_throughput", "output_throughput",
                  "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_kv_usage_perc",
                  "peak_kv_usage_perc", "num_preemptions", "load_imbalance", "completed",
                  "failed")


@dataclass(slots=True)
class ClusterView:
    """One cluster run as tables: the whole cluster's summary, one row per instance (its
    summary) and one row per engine step of every instance (with its `instance`)."""

    router: str
    summary: dict[str, Any]
    instances: pd.DataFrame
    steps: pd.DataFrame


def cluster_view(trace: Trace, setup: Setup, policy: str, num_instances: int, router: str,
                 router_seed: int = 0) -> ClusterView:
    """Simulate `trace` on `num_instances` of the setup's machine behind `router` and
    tabulate the run; a KvlabError for an instance count outside 1..MAX_INSTANCES."""
    if not 1 <= num_instances <= MAX_INSTANCES:
        raise KvlabError(f"instances: {num_instances}; expected 1 to {MAX_INSTANCES}")
    result = simulate_cluster(trace, setup.config(policy), num_instances=num_instances,
                              router=router, router_seed=router_seed)
    summary = summarize_cluster(result, percentile_metrics=("ttft", "tpot", "itl", "e2el"),
                                metric_percentiles=PERCENTILES)
    instances = pd.DataFrame([{k: v for k, v in s.items() if not isinstance(v, (dict, list))}
                              for s in summary["instances"]])
    instances.insert(0, "router", instances.pop("router"))  # each summary's own
    return ClusterView(router, summary, instances, cluster_step_table(result))


def router_table(views: Sequence[ClusterView]) -> pd.DataFrame:
    """One row per router: its cluster-wide metrics and `load_imbalance`, the most requests
    any instance served over the mean per instance (1: even)."""
    rows = []
    for view in views:
        routed = view.instances["num_prompts"]
        mean = float(routed.mean())
        imbalance = float(routed.max()) / mean if mean > 0 else 1.0
        row = {"router": view.router, **{k: view.summary.get(k) for k in ROUTER_COLUMNS}}
        row["load_imbalance"] = imbalance
        rows.append(row)
    return pd.DataFrame(rows, columns=["router", *ROUTER_COLUMNS])


def instance_table(views: Sequence[ClusterView]) -> pd.DataFrame:
    """Every router's instances, one row each (router, instance, then its summary)."""
    return pd.concat([view.instances for view in views], ignore_index=True)
