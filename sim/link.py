"""The device-host link (PCIe) that swaps cross, as a SimPy resource.

A transfer takes num_transfers x latency + bytes / bandwidth (the cost model's `swap_time_s`), so
swapping many scattered pages costs more than one run of consecutive pages. The link carries one
transfer at a time: instances that share a host link queue for it.

Overlap: none. The engine executes a step's MemOps (swap-outs, copies, swap-ins) before the
step's forward pass on one stream, so a step lasts link time + copy time + compute time, and the
simulator charges it the same way; the link being busy never hides behind compute.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from kvlab.policies import MemOps
from kvlab.sim.cost_model import CostModel


class HostLink:
    """A host link shared by the instances of one box: one transfer at a time, in request order."""

    __slots__ = ("_cost_model", "_env", "busy_s", "num_transfers", "resource")

    def __init__(self, env: simpy.Environment, cost_model: CostModel) -> None:
        self._env = env
        self._cost_model = cost_model
        self.resource = simpy.Resource(env, capacity=1)
        self.busy_s = 0.0  # seconds the link spent transferring
        self.num_transfers = 0  # separate copies (runs of consecutive pages) carried

    def swap_time_s(self, ops: MemOps) -> float:
        """Seconds a step's swap-outs and swap-ins occupy the link, one direction then the other."""
        cost = self._cost_model
        seconds = 0.0
        if ops.swap_outs:
            seconds += cost.swap_time_s(len(ops.swap_outs), ops.num_swap_out_transfers)
        if ops.swap_ins:
            seconds += cost.swap_time_s(len(ops.swap_ins), ops.num_swap_in_transfers)
        return seconds

    def transfer(self, ops: MemOps, seconds: float) -> Generator[simpy.Event, Any, None]:
        """SimPy process body: wait for the link, then hold it for `seconds`."""
        with self.resource.request() as request:
            yield request
            yield self._env.timeout(seconds)
        self.busy_s += seconds
        self.num_transfers += ops.num_swap_out_transfers + ops.num_swap_in_transfers
