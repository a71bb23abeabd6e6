"""`simulate`: replay a trace through one simulated instance and return its `RunResult`;
`compare`: the same trace through several policies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import simpy

from kvlab.metrics import RunResult
from kvlab.policies import KVCacheManager, PolicySpec, Request, Scheduler, StepLoop
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.sim.arrivals import arrival_process
from kvlab.sim.assembly import (
    build_manager,
    build_tier_links,
    default_cost_model,
    instance_tiers,
    tier_stats,
)
from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel
from kvlab.sim.instance import SimInstance
from kvlab.sim.link import HostLink
from kvlab.sim.requests import to_requests
from kvlab.traces import Trace


def simulate(
    trace: Trace,
    config: SimConfig,
    *,
    cost_model: CostModel | None = None,
    preemption_costs: PreemptionCosts | None = None,
    progress: bool = False,
    decode_runs: bool = True,
) -> RunResult:
    """Run every request of `trace` to completion (or failure) and collect the run's records.

    `cost_model` times every step and memory transfer; it defaults to the calibrated model the
    config loaded (`SimConfig.calibrated`), else the roofline of the config's model and hardware.
    `preemption_costs` answers the manager's swap-versus-recompute question under
    preemption=auto (default: `cost_model`; a replay of measured step durations passes the
    engine's measured costs here). `progress` shows a tqdm bar of finished requests on stderr.
    `decode_runs` False steps every step one by one instead of committing runs of plain decode
    steps at once (the same result; for tests and profiling).
    """
    simulation = Simulation(trace, config, cost_model=cost_model,
                            preemption_costs=preemption_costs, decode_runs=decode_runs)
    return simulation.run(progress=progress)


class Simulation:
    """One trace on one simulated instance, built and ready to run (once).

    The parts stay reachable after `run` (scheduler, manager, requests, instance) for tests and
    tools that inspect the end state.
    """

    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        *,
        cost_model: CostModel | None = None,
        preemption_costs: PreemptionCosts | None = None,
        decode_runs: bool = True,
    ) -> None:
        self.trace = trace
        self.config = config
        self.policy = config.policy
        self.capacity = config.capacity
        if cost_model is None:
            cost_model = default_cost_model(config)
        self.cost_model = cost_model
        self.tiers = instance_tiers(config)
        self.manager = build_manager(config, cost_model, preemption_costs, self.tiers)
        self.scheduler = Scheduler(config.scheduler_config(), self.manager)
        self.requests = to_requests(trace)
        # A server's API delays each request on its way in (and its tokens on their way out):
        # the scheduler sees it that much later; latencies still count from the send (`run`).
        self.api_latency_s = float(getattr(cost_model, "api_latency_s", 0.0))
        for request in self.requests:
            request.arrival_s += self.api_latency_s
        self.env = simpy.Environment()
        self.link = HostLink(self.env, cost_model)
        self.tier_links = build_tier_links(self.env, config, self.tiers, self.link)
        self.loop = StepLoop(self.scheduler, self.requests)
        self.instance = SimInstance(self.env, self.loop, cost_model, self.link,
                                    decode_runs=decode_runs, tier_links=self.tier_links)

    def run(self, *, progress: bool = False) -> RunResult:
        """Simulate until every request has finished; check conservation; return the records."""
        env, instance = self.env, self.instance
        bar = _progress_bar(len(self.requests), enabled=progress)
        if bar is not None:
            instance.on_finished = bar.update
        env.process(arrival_process(env, (r.arrival_s for r in self.requests), instance.wake))
        env.process(instance.run())
        try:
            env.run()
        finally:
            if bar is not None:
                bar.close()
        _check_conservation(self.requests, self.manager)
        for request in self.requests:
            request.arrival_s -= self.api_latency_s
        capacity = self.capacity
        return RunResult(
            requests=self.requests,
            steps=self.loop.steps,
            itls_s=np.frombuffer(self.scheduler.itls_s, dtype=np.float64).copy(),
            duration_s=_duration_s(self.requests),
            page_size=capacity.page_size,
            num_total_pages=capacity.num_pages,
            kv_cache_size_tokens=capacity.num_tokens,
            num_host_pages=self.manager.num_host_pages,
            metadata={**self.config.metadata(), **self.trace.result_metadata(), "backend": "sim",
                      **tier_stats(self.manager, self.tiers, self.tier_links, self.requests)},
        )


def compare(
    trace: Trace, config: SimConfig, policies: Iterable[PolicySpec | str]
) -> list[RunResult]:
    """`simulate` the same trace and config once per policy, in the order given."""
    return [simulate(trace, config.with_policy(policy)) for policy in policies]


def _progress_bar(total: int, *, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="simulating", leave=False)


def _duration_s(requests: Sequence[Request]) -> float:
    """From the first arrival to the last finish (0 for an empty trace)."""
    if not requests:
        return 0.0
    first = min(r.arrival_s for r in requests)
    last = max(r.finish_s for r in requests if r.finish_s is not None)
    return float(last - first)


def _check_conservation(requests: Sequence[Request], manager: KVCacheManager) -> None:
    """Every request finished (or failed with a reason) and every page came back."""
    unfinished = [r.request_id for r in requests if not r.is_finished]
    assert not unfinished, f"requests {unfinished[:5]} never finished"
    unexplained = [r.request_id for r in requests if r.error is None and r.finish_s is None]
    assert not unexplained, f"requests {unexplained[:5]} ended without a stamp or a reason"
    manager.check_tiers()
    usage = manager.usage()
    assert usage.num_used_pages == 0, f"{usage.num_used_pages} pages still in use at the end"
    assert usage.num_host_used_pages == 0, f"{usage.num_host_used_pages} host pages still in use"
    assert usage.num_live_token_slots == 0, "live token slots left at the end"
