"""The device-host link (PCIe) that swaps cross, and the links to the memory tiers.

A transfer takes num_transfers x latency + bytes / bandwidth (the cost model's `swap_time_s`), so
swapping many scattered pages costs more than one run of consecutive pages. A link carries one
transfer at a time, in the order they are asked for (`LinkClock`): what a capacity-1 SimPy
resource does, kept as arithmetic so that a transfer nobody waits for (a tier write) costs no
event at all.

Overlap: none. The engine executes a step's MemOps (swap-outs, copies, swap-ins) before the
step's forward pass on one stream, so a step lasts link time + copy time + compute time, and the
simulator charges it the same way; the link being busy never hides behind compute.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from kvlab.policies import MemOps
from kvlab.policies.outputs import TierBatch
from kvlab.sim.arrival_process import delay_until
from kvlab.sim.cost_model import CostModel


class LinkClock:
    """One link's queue: transfers one at a time, each starting when the link is free of the
    ones asked for before it (first come, first served)."""

    __slots__ = ("free_at_s",)

    def __init__(self) -> None:
        self.free_at_s = 0.0  # when the last transfer asked for ends

    def reserve(self, now_s: float, seconds: float) -> float:
        """Queue a transfer of `seconds` asked for at `now_s`; returns when it ends."""
        start_s = self.free_at_s if self.free_at_s > now_s else now_s
        self.free_at_s = end_s = start_s + seconds
        return end_s


def wait_until(env: simpy.Environment, end_s: float) -> simpy.Timeout:
    """An event at `end_s` exactly (a transfer's end: the link's time plus its own)."""
    return env.timeout(delay_until(env.now, end_s))


class HostLink:
    """A device's host link: one transfer at a time, in request order (the host tier's
    loads and writes queue on it too)."""

    __slots__ = ("_cost_model", "_env", "busy_s", "clock", "num_transfers")

    def __init__(self, env: simpy.Environment, cost_model: CostModel) -> None:
        self._env = env
        self._cost_model = cost_model
        self.clock = LinkClock()
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
        yield wait_until(self._env, self.reserve(ops, seconds))

    def reserve(self, ops: MemOps, seconds: float) -> float:
        """Queue the swaps of `ops`, `seconds` long, now; returns when they end."""
        self.busy_s += seconds
        self.num_transfers += ops.num_swap_out_transfers + ops.num_swap_in_transfers
        return self.clock.reserve(self._env.now, seconds)


class TierLinks:
    """The links to an instance's memory tiers (host DRAM over PCIe, NVMe, RDMA to a remote
    pool), one `LinkClock` each, carrying the tier writes and loads of its steps.

    A step's copies over one link are one batched transfer: latency + pages x page bytes /
    bandwidth (reads for loads, writes for stores, the lower tier's writes for a page moved
    down). The host tier's link is the swap link itself (one PCIe link carries both). Writes
    are asynchronous: a step starts them and goes on (vLLM's offloading stores after the
    forward pass), but they hold the link, so a later load queues behind them. Loads are
    waited for: with overlap "none" the step computes after its loads; with "layerwise" the
    forward pass runs as the layers arrive, so the step lasts max(loads, compute) plus one
    layer's share of the shorter.
    """

    def __init__(self, env: simpy.Environment, tiers: list[Any],
                 links: list[tuple[float, float, float]], *, page_bytes: int,
                 host_link: HostLink, overlap: str, num_layers: int) -> None:
        self._env = env
        self._page_bytes = page_bytes
        self._links = links  # per level from 1: (read bytes/s, write bytes/s, latency)
        self._clocks = [host_link.clock if tier.kind == "host" else LinkClock()
                        for tier in tiers]
        self._layerwise = overlap == "layerwise"
        self._num_layers = max(1, num_layers)
        self.busy_s = [0.0] * len(tiers)  # seconds each link spent on tier transfers
        self.num_pages_loaded = [0] * len(tiers)

    def transfer_time_s(self, level: int, num_pages: int, *, write: bool) -> float:
        """Seconds the link of `level` needs for `num_pages` pages: one batched transfer, as
        vLLM's offloading connector copies a step's blocks in one call."""
        read_bw, write_bw, latency = self._links[level - 1]
        return latency + num_pages * self._page_bytes / (write_bw if write else read_bw)

    def start_writes(self, ops: MemOps) -> None:
        """Queue the step's tier writes, one transfer per destination link (nothing waits
        for them but the transfers queued after them)."""
        now_s = self._env.now
        for level, num_pages in _pages_by_level(ops.tier_writes, destination=True).items():
            self._hold(level, now_s, self.transfer_time_s(level, num_pages, write=True))

    def load(self, ops: MemOps, device_s: float) -> Generator[simpy.Event, Any, float]:
        """SimPy process body: carry out the step's tier loads (all links at once); returns
        the compute seconds left after them (all of `device_s` without layerwise overlap)."""
        env = self._env
        start = end = env.now
        for level, num_pages in _pages_by_level(ops.tier_loads, destination=False).items():
            self.num_pages_loaded[level - 1] += num_pages
            seconds = self.transfer_time_s(level, num_pages, write=False)
            end = max(end, self._hold(level, start, seconds))
        yield wait_until(env, end)
        if not self._layerwise:
            return device_s
        waited = env.now - start
        # layer l computes once its KV arrives: the longer of the two, plus one layer of the other
        return max(device_s - waited, 0.0) + min(waited, device_s) / self._num_layers

    def _hold(self, level: int, now_s: float, seconds: float) -> float:
        """Queue a transfer of `seconds` on the link of `level`; returns when it ends."""
        self.busy_s[level - 1] += seconds
        return self._clocks[level - 1].reserve(now_s, seconds)


def _pages_by_level(batches: list[TierBatch], *, destination: bool) -> dict[int, int]:
    """Pages per tier whose link carries them: a write's destination, a load's source."""
    pages: dict[int, int] = {}
    for batch in batches:
        level = batch.dst_level if destination else batch.src_level
        pages[level] = pages.get(level, 0) + len(batch.dst_pages)
    return pages
