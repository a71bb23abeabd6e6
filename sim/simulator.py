"""`simulate`: replay a trace through one simulated instance and return its `RunResult`;
`compare`: the same trace through several policies."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import simpy

from kvlab.heap import paused_gc
from kvlab.metrics import RunResult
from kvlab.policies import PolicySpec, Scheduler, StepLoop
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.sim.api_latency import api_delays, delay_arrivals, restore_sends, run_with_api_load
from kvlab.sim.assembly import (
    build_manager,
    build_tier_links,
    check_conservation,
    default_cost_model,
    instance_result,
    instance_tiers,
    progress_bar,
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
    partial_on_interrupt: bool = False,
) -> RunResult:
    """Run every request of `trace` to completion (or failure) and collect the run's records.

    `cost_model` times every step and memory transfer; it defaults to the calibrated model the
    config loaded (`SimConfig.calibrated`), else the roofline of the config's model and hardware.
    `preemption_costs` answers the manager's swap-versus-recompute question under
    preemption=auto (default: `cost_model`; a replay of measured step durations passes the
    engine's measured costs here). `progress` shows a tqdm bar of finished requests on stderr.
    `decode_runs` False steps every step one by one instead of committing runs of plain decode
    steps at once (the same result; for tests and profiling). A cost model whose API latency
    grows with the requests in flight is run until the loads it sees repeat
    (`kvlab.sim.api_latency`). `partial_on_interrupt`: Ctrl-C (KeyboardInterrupt) ends the
    run where it is and returns the requests finished by then (`Simulation.run`).
    """
    model = default_cost_model(config) if cost_model is None else cost_model

    def run_once(in_flight: dict[int, int] | None, desc: str) -> RunResult:
        simulation = Simulation(trace, config, cost_model=model,
                                preemption_costs=preemption_costs, decode_runs=decode_runs,
                                in_flight=in_flight)
        return simulation.run(progress=progress, desc=desc,
                              partial_on_interrupt=partial_on_interrupt)

    return run_with_api_load(run_once, lambda result: result.requests, model)


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
        in_flight: dict[int, int] | None = None,
    ) -> None:
        """`in_flight`: request id -> requests in flight at its send, for an API latency with
        a load term (`kvlab.sim.api_latency`; None: its constant alone). A tier page size of
        `auto` is settled for the trace (`SimConfig.with_tier_pages_for`)."""
        config = config.with_tier_pages_for(trace)
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
        self._sends_s = delay_arrivals(self.requests,
                                       api_delays(self.requests, cost_model, in_flight))
        self.env = simpy.Environment()
        self.link = HostLink(self.env, cost_model)
        self.tier_links = build_tier_links(self.env, config, self.tiers, self.link)
        self.loop = StepLoop(self.scheduler, self.requests)
        self.instance = SimInstance(self.env, self.loop, cost_model, self.link,
                                    decode_runs=decode_runs, tier_links=self.tier_links)

    def run(self, *, progress: bool = False, desc: str = "simulating",
            partial_on_interrupt: bool = False) -> RunResult:
        """Simulate until every request has finished; check conservation; return the records.
        With `partial_on_interrupt`, Ctrl-C (KeyboardInterrupt) stops the run where it is: the
        result holds the requests finished by then, the steps run, and the simulated time
        and requests left unfinished in its metadata (`interrupted_at_s`,
        `num_unfinished_requests`); conservation is not checked (a step was cut short)."""
        env, instance = self.env, self.instance
        bar = progress_bar(len(self.requests), enabled=progress, desc=desc)
        if bar is not None:
            instance.on_finished = lambda ended: bar.update(len(ended))
        env.process(instance.run())  # alone, it sleeps to its own next arrival
        interrupted: dict[str, Any] = {}
        try:
            with paused_gc():  # the run makes next to no cyclic garbage (kvlab.heap)
                env.run()
        except KeyboardInterrupt:
            if not partial_on_interrupt:
                raise
            interrupted["interrupted_at_s"] = env.now
        finally:
            if bar is not None:
                bar.close()
        requests = self.requests
        if interrupted:
            requests = [r for r in requests if r.status.is_finished]
            interrupted["num_unfinished_requests"] = len(self.requests) - len(requests)
        else:
            check_conservation(self.requests, self.manager)
        restore_sends(self.requests, self._sends_s)
        metadata = {**self.config.metadata(), **self.trace.result_metadata(), "backend": "sim",
                    **interrupted}
        return instance_result(self.config, requests, self.loop, self.tiers,
                               self.tier_links, metadata, self.instance.group_memory)


def compare(
    trace: Trace, config: SimConfig, policies: Iterable[PolicySpec | str]
) -> list[RunResult]:
    """`simulate` the same trace and config once per policy, in the order given."""
    return [simulate(trace, config.with_policy(policy)) for policy in policies]
