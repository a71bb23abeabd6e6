"""`simulate_cluster`: replay a trace through N simulated instances behind a router.

All instances share one SimPy clock; each has its own KV-cache manager, scheduler, step loop,
host link and step process (`ClusterInstance`, `kvlab.sim.cluster_instance`), built from its
`InstanceSpec` exactly as `simulate` builds its one instance. Requests are not handed out in
advance: each is routed when it arrives, on the state of the instances at that moment
(`kvlab.sim.cluster_arrivals`), and submitted to the chosen instance's step loop, which it then
joins by the shared time rule (a step starting at t admits every request arrived by t). The
instances' runs make the cluster's (`kvlab.sim.cluster_totals`).

With prefill/decode disaggregation (`pd`), arrivals are routed to "prefill" instances only,
which hand each request's KV to a "decode" instance (`kvlab.sim.disaggregation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import simpy

from kvlab.errors import KvlabError
from kvlab.heap import paused_gc
from kvlab.policies import Request
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.policies.scheduler_config import check_whole_number
from kvlab.sim.api_latency import (
    api_delays,
    api_latency_terms,
    delay_arrivals,
    restore_sends,
    run_with_api_load,
)
from kvlab.sim.assembly import check_conservation, default_cost_model, progress_bar
from kvlab.sim.cluster_arrivals import ClusterArrivals
from kvlab.sim.cluster_instance import (
    ClusterInstance,
    InstanceSpec,
    check_roles,
    shared_remote_pool,
)
from kvlab.sim.cluster_result import ClusterResult
from kvlab.sim.cluster_totals import cluster_tier_stats, whole_cluster_run
from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel
from kvlab.sim.disaggregation import Handoffs, pd_num_instances
from kvlab.sim.instance import ArrivalSource
from kvlab.sim.requests import to_requests
from kvlab.sim.router import check_router, make_router
from kvlab.traces import Trace

DEFAULT_ROUTER = "round-robin"


def simulate_cluster(
    trace: Trace,
    config: SimConfig,
    *,
    num_instances: int = 1,
    router: str = DEFAULT_ROUTER,
    router_seed: int = 0,
    pd: tuple[int, int] | None = None,
    pd_link_bandwidth: float | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
    decode_runs: bool = True,
) -> ClusterResult:
    """Run every request of `trace` on `num_instances` instances of `config` behind the
    registered router `router` (`kvlab.sim.router`; `router_seed` seeds a random one).

    `pd` (P, D) disaggregates: P prefill and D decode instances (num_instances then 1 or
    P + D), the router choosing among the prefill ones; KV goes from prefill to decode at
    `pd_link_bandwidth` bytes/s (default: the hardware's RDMA figure, `remote_bandwidth`).
    `cost_model` times every instance's steps (default: the config's, as `simulate`);
    `progress` and `decode_runs` are `simulate`'s. With one instance, every request's record
    is the one `simulate` gives. Raises KvlabError for num_instances < 1, an unknown router
    or a `pd` that contradicts num_instances.
    """
    check_whole_number("num_instances", num_instances, 1)
    check_whole_number("router_seed", router_seed, 0)
    config = config.with_tier_pages_for(trace)  # (`auto` tier pages: `simulate`'s)
    if pd is None:
        specs = [InstanceSpec(config) for _ in range(num_instances)]
    else:
        pd_num_instances(pd, num_instances)
        prefill, decode = pd
        specs = ([InstanceSpec(config, "prefill") for _ in range(prefill)]
                 + [InstanceSpec(config, "decode") for _ in range(decode)])

    def run_once(in_flight: dict[int, int] | None, desc: str) -> ClusterResult:
        cluster = Cluster(trace, specs, router=router, router_seed=router_seed,
                          cost_model=cost_model, decode_runs=decode_runs,
                          pd_link_bandwidth=pd_link_bandwidth, in_flight=in_flight)
        return cluster.run(progress=progress, desc=desc)

    model = default_cost_model(config) if cost_model is None else cost_model
    return run_with_api_load(run_once, lambda result: result.cluster.requests, model)


class Cluster:
    """One trace on a cluster of simulated instances behind a router, built and ready to run
    (once). The parts stay reachable after `run` (`instances`) for tests and tools."""

    def __init__(
        self,
        trace: Trace,
        specs: Sequence[InstanceSpec],
        *,
        router: str = DEFAULT_ROUTER,
        router_seed: int = 0,
        cost_model: CostModel | None = None,
        preemption_costs: PreemptionCosts | None = None,
        decode_runs: bool = True,
        pd_link_bandwidth: float | None = None,
        in_flight: dict[int, int] | None = None,
    ) -> None:
        """`in_flight`: as `Simulation`'s (the requests in flight at each send, for an API
        latency with a load term)."""
        if not specs:
            raise KvlabError("a cluster needs at least one instance", parameters=("num_instances",))
        check_roles([spec.role for spec in specs])
        self.trace = trace
        self.specs = list(specs)
        self.router_name = check_router(router)
        self.router_seed = router_seed
        self.requests = to_requests(trace)
        models = [default_cost_model(spec.config) if cost_model is None else cost_model
                  for spec in self.specs]
        # As `Simulation`: the scheduler sees a request its API's latency after it was sent
        # (before the arrivals are ordered: a load term can reorder them). One latency for the
        # cluster: its router sits behind one API.
        terms = {api_latency_terms(model) for model in models}
        assert len(terms) == 1, f"instances with different API latencies {terms}"
        self._sends_s = delay_arrivals(self.requests,
                                       api_delays(self.requests, models[0], in_flight))
        self.env = simpy.Environment()
        self.arrivals = ClusterArrivals(self.requests, make_router(router, seed=router_seed))
        self.handoffs = self._handoffs(pd_link_bandwidth)
        self.shared_tiers = shared_remote_pool(self.specs[0].config)
        decode_positions = {index: position for position, index in enumerate(
            i for i, spec in enumerate(self.specs) if spec.role == "decode")}
        self.instances = [
            ClusterInstance(self.env, index, spec, cost_model=models[index],
                            preemption_costs=preemption_costs, decode_runs=decode_runs,
                            arrivals=self._arrivals_of(index, decode_positions),
                            shared_tiers=self.shared_tiers, handoffs=self.handoffs)
            for index, spec in enumerate(self.specs)
        ]
        self.arrivals.instances = [i for i in self.instances if i.role != "decode"]
        if self.handoffs is not None:
            self.handoffs.attach([i for i in self.instances if i.role == "prefill"],
                                 [i for i in self.instances if i.role == "decode"],
                                 self.arrivals.next_arrival_s)

    def run(self, *, progress: bool = False, desc: str = "simulating") -> ClusterResult:
        """Simulate until every request has finished; check conservation per instance and that
        every request was routed once; return the records."""
        env = self.env
        bar = progress_bar(len(self.requests), enabled=progress, desc=desc)
        handoffs = self.handoffs
        for instance in self.instances:
            if instance.role == "prefill" and handoffs is not None:
                # a prefill step's finished requests go on to decode; the others are done
                def hand_on(finished: list[Request], index: int = instance.index) -> None:
                    done = handoffs.finished_at_prefill(index, finished)
                    if bar is not None and done:
                        bar.update(done)
                instance.instance.on_finished = hand_on
            elif bar is not None:
                instance.instance.on_finished = lambda ended: bar.update(len(ended))
            env.process(instance.instance.run())
        env.process(self.arrivals.process(env))
        try:
            with paused_gc():  # the run makes next to no cyclic garbage (kvlab.heap)
                env.run()
        finally:
            if bar is not None:
                bar.close()
        for instance in self.instances:
            check_conservation(instance.requests, instance.manager)
        routed = sorted(r.request_id for i in self.arrivals.instances for r in i.requests)
        assert routed == sorted(r.request_id for r in self.requests), "a request routed twice"
        if self.handoffs is not None:
            assert not self.handoffs.budgets, "a request never left its prefill instance"
        restore_sends(self.requests, self._sends_s)
        return self._result()

    def _result(self) -> ClusterResult:
        """Every instance's run, and the whole cluster's as one run."""
        first = self.instances[0]
        metadata = {
            **first.config.metadata(), **self.trace.result_metadata(), "backend": "sim",
            "num_instances": len(self.instances), "router": self.router_name,
            "router_seed": self.router_seed, **self._pd_metadata(),
        }
        runs = [instance.result(metadata) for instance in self.instances]
        metadata = {**metadata, **cluster_tier_stats(self.instances, self.shared_tiers,
                                                     self.requests)}
        return ClusterResult(cluster=whole_cluster_run(self.requests, runs, metadata),
                             instances=runs, instance_of=dict(self.arrivals.instance_of),
                             roles=[instance.role for instance in self.instances],
                             router=self.router_name, router_seed=self.router_seed)

    def _arrivals_of(self, index: int, decode_positions: dict[int, int]) -> ArrivalSource:
        """Where instance `index`'s requests come from: the router, or (a decode instance)
        the handoffs."""
        if self.handoffs is None or index not in decode_positions:
            return self.arrivals
        return self.handoffs.arrivals_of(decode_positions[index])

    def _handoffs(self, bandwidth: float | None) -> Handoffs | None:
        """The prefill-to-decode handoffs (None without disaggregation): the link is the
        hardware's RDMA one unless `bandwidth` (bytes/s) is given."""
        if not any(spec.role == "prefill" for spec in self.specs):
            return None
        config = self.specs[0].config
        hardware = config.hardware_spec
        return Handoffs(self.env, page_size=config.serving.page_size,
                        page_bytes=config.page_bytes,
                        bandwidth=hardware.remote_bandwidth if bandwidth is None else bandwidth,
                        latency_s=hardware.remote_latency_s)

    def _pd_metadata(self) -> dict[str, Any]:
        """`pd` as P:D, the link and the handoffs' counters (nothing without disaggregation)."""
        if self.handoffs is None:
            return {}
        roles = [spec.role for spec in self.specs]
        return {"pd": f"{roles.count('prefill')}:{roles.count('decode')}",
                "pd_link_bandwidth": self.handoffs.bandwidth, **self.handoffs.stats()}
