"""Tell the world which policy this vLLM evicts by: a `/metrics` info series that
`kvlab bench` and `kvlab validate` read (`kvlab.bench.observed.EVICTION_INFO`), so the replay
runs the same policy without the user saying it twice."""

from __future__ import annotations

import kvlab

METRIC = "kvlab:eviction_policy_info"


def export_policy(spec: str) -> bool:
    """Register the info series `kvlab:eviction_policy_info{policy=spec}` = 1 in this process's
    Prometheus registry (vLLM's API server serves it on /metrics). False where
    prometheus_client is missing or the series exists already."""
    try:
        from prometheus_client import Gauge
    except ImportError:
        return False
    try:
        gauge = Gauge(METRIC, "The eviction policy of vLLM's device prefix cache (kvlab plugin).",
                      ["policy", "kvlab_version"])
    except ValueError:  # registered already in this process
        return False
    gauge.labels(policy=spec, kvlab_version=kvlab.__version__).set(1)
    return True
