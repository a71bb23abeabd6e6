"""kvlab.sim: the SimPy simulator of one serving instance's KV-cache memory.

`simulate(trace, SimConfig(...))` replays a trace through the shared scheduler and KV-cache
manager of `kvlab.policies`, charging each engine step from a cost model (the roofline by
default) and swaps on a host-link resource, and returns a `kvlab.metrics.RunResult`.
"""

from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel, RooflineCostModel, StepShape
from kvlab.sim.instance import SimInstance
from kvlab.sim.link import HostLink
from kvlab.sim.replayed import ReplayedStepTimes
from kvlab.sim.requests import to_requests
from kvlab.sim.simulator import Simulation, compare, simulate

__all__ = [
    "CostModel",
    "HostLink",
    "ReplayedStepTimes",
    "RooflineCostModel",
    "SimConfig",
    "SimInstance",
    "Simulation",
    "StepShape",
    "compare",
    "simulate",
    "to_requests",
]
