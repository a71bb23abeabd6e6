"""kvlab.sim: the SimPy simulator of one serving instance's KV-cache memory.

`simulate(trace, SimConfig(...))` replays a trace through the shared scheduler and KV-cache
manager of `kvlab.policies`, charging each engine step from a cost model (the roofline by
default) and swaps on a host-link resource, and returns a `kvlab.metrics.RunResult`.
`simulate_cluster(trace, config, num_instances=N, router=NAME)` runs N such instances on one
clock behind a router (`kvlab.sim.router`) and returns a `ClusterResult`.
"""

from kvlab.sim.cluster import Cluster, InstanceSpec, simulate_cluster
from kvlab.sim.cluster_result import ClusterResult, cluster_request_table, summarize_cluster
from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel, RooflineCostModel, StepShape
from kvlab.sim.instance import SimInstance
from kvlab.sim.link import HostLink
from kvlab.sim.replayed import ReplayedStepTimes
from kvlab.sim.requests import to_requests
from kvlab.sim.router import Router, make_router, router_names
from kvlab.sim.simulator import Simulation, compare, simulate

__all__ = [
    "Cluster",
    "ClusterResult",
    "CostModel",
    "HostLink",
    "InstanceSpec",
    "ReplayedStepTimes",
    "RooflineCostModel",
    "Router",
    "SimConfig",
    "SimInstance",
    "Simulation",
    "StepShape",
    "cluster_request_table",
    "compare",
    "make_router",
    "router_names",
    "simulate",
    "simulate_cluster",
    "summarize_cluster",
    "to_requests",
]
