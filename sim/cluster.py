"""`simulate_cluster`: replay a trace through N simulated instances behind a router.

All instances share one SimPy clock; each has its own KV-cache manager, scheduler, step loop,
host link and step process (`SimInstance`), built from its `InstanceSpec` exactly as
`simulate` builds its one instance. Requests are not handed out in advance: each is routed
when it arrives, on the state of the instances at that moment, and submitted to the chosen
instance's step loop, which it then joins by the shared time rule (a step starting at t admits
every request arrived by t). Since any arrival may be routed to any instance, each instance's
decode runs stop at the next arrival of the whole cluster (`_ClusterArrivals` is every
instance's `ArrivalSource`), which keeps the fast path exact.

An instance has a role and its own config: "mixed" instances prefill and decode; with
prefill/decode disaggregation (`pd`), arrivals are routed to "prefill" instances only, which
hand each request's KV to a "decode" instance (`kvlab.sim.disaggregation`). A remote memory
tier is one pool shared by every instance (each reaches it over its own link); host and SSD
tiers are each instance's own.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from kvlab.errors import KvlabError
from kvlab.heap import paused_gc
from kvlab.metrics import RunResult, StepRecorder
from kvlab.policies import Request, Scheduler, StepLoop
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.policies.scheduler import check_whole_number
from kvlab.policies.tiers import PrefixTier, TierStats, build_tier
from kvlab.sim.api_latency import (
    api_delays,
    api_latency_terms,
    delay_arrivals,
    restore_sends,
    run_with_api_load,
)
from kvlab.sim.arrival_process import arrival_process
from kvlab.sim.assembly import (
    build_manager,
    build_tier_links,
    check_conservation,
    default_cost_model,
    duration_s,
    instance_result,
    instance_tiers,
    progress_bar,
    scheduled_prompt_tokens,
    tier_stats,
)
from kvlab.sim.cluster_result import ClusterResult
from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel
from kvlab.sim.disaggregation import Handoffs, pd_num_instances
from kvlab.sim.instance import ArrivalSource, SimInstance
from kvlab.sim.link import HostLink
from kvlab.sim.requests import to_requests
from kvlab.sim.router import Router, check_router, make_router
from kvlab.traces import Trace

# What an instance does: both stages, or one of them (prefill/decode disaggregation).
ROLES = ("mixed", "prefill", "decode")
DEFAULT_ROUTER = "round-robin"


def shared_remote_pool(config: SimConfig) -> dict[str, PrefixTier]:
    """The cluster's remote pool, one for every instance ({} without a remote tier)."""
    for tier in config.serving.kv_tiers.tiers:
        if tier.kind == "remote":
            return {"remote": build_tier(config.serving.kv_tiers, tier, config.policy.block_size,
                                         config.page_bytes)}
    return {}


@dataclass(slots=True)
class InstanceSpec:
    """One instance of a cluster: the config it runs and its role."""

    config: SimConfig
    role: str = "mixed"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise KvlabError(f"instance role is {self.role!r}; expected one of "
                             f"{', '.join(ROLES)}", parameters=("role",))


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


def check_roles(roles: Sequence[str]) -> None:
    """A KvlabError unless the roles make a cluster: all mixed, or prefill and decode ones."""
    kinds = set(roles)
    if kinds != {"mixed"} and kinds != {"prefill", "decode"}:
        raise KvlabError(f"instance roles {sorted(kinds)}: a cluster is all mixed, or both "
                         "prefill and decode instances (pd P:D)", parameters=("pd",))


class ClusterInstance:
    """One instance of a cluster: its parts, and what a router reads of it."""

    __slots__ = ("config", "cost_model", "handoffs", "index", "instance", "link", "loop",
                 "manager", "requests", "role", "scheduler", "tier_links", "tiers")

    def __init__(self, env: simpy.Environment, index: int, spec: InstanceSpec, *,
                 cost_model: CostModel | None, preemption_costs: PreemptionCosts | None,
                 decode_runs: bool, arrivals: ArrivalSource,
                 shared_tiers: dict[str, PrefixTier], handoffs: Handoffs | None) -> None:
        config = spec.config
        self.index = index
        self.role = spec.role
        self.config = config
        self.handoffs = handoffs  # a prefill instance's way to its decode instances
        self.cost_model = default_cost_model(config) if cost_model is None else cost_model
        # its own host and SSD tiers; the remote pool is the cluster's one, shared
        self.tiers = instance_tiers(config, shared_tiers)
        self.manager = build_manager(config, self.cost_model, preemption_costs, self.tiers)
        self.scheduler = Scheduler(config.scheduler_config(), self.manager)
        self.loop = StepLoop(self.scheduler, [])
        self.link = HostLink(env, self.cost_model)  # one host link per instance (per device)
        self.tier_links = build_tier_links(env, config, self.tiers, self.link)
        self.instance = SimInstance(env, self.loop, self.cost_model, self.link,
                                    decode_runs=decode_runs, tier_links=self.tier_links,
                                    arrivals=arrivals)
        self.requests: list[Request] = []  # routed here, in arrival order

    def num_requests(self) -> int:
        """Requests held: routed and not yet admitted, waiting, running, swapped out."""
        scheduler = self.scheduler
        return (len(self.loop.arrivals) + len(scheduler.waiting) + len(scheduler.running)
                + len(scheduler.swapped))

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """Leading tokens of `request` in this instance's prefix cache now, on the device or
        in its tiers: the manager's lookup. Between steps (routing never runs inside one) it
        changes no page, count or eviction order: only the memo of its last lookup, which an
        admission looks up again for its own request, and a flush of tier write-backs that
        every step's end has already done."""
        return self.manager.num_computed_prefix_tokens(request)

    def submit(self, request: Request) -> None:
        """Route `request` here: it joins at this instance's next step start."""
        if self.role == "prefill" and self.handoffs is not None:
            self.handoffs.routed_to_prefill(request)
        self.requests.append(request)
        self.loop.submit(request)
        self.instance.wake()

    def hand_over(self, request: Request) -> None:
        """A request whose prompt KV another instance sent joins now, as a step starts (a
        decode instance)."""
        self.requests.append(request)
        self.scheduler.add_request(request)

    def wake(self) -> None:
        """Resume its step process if it sleeps for want of work."""
        self.instance.wake()

    def has_work(self) -> bool:
        """True while it holds a request or one routed here is yet to join."""
        return self.loop.has_work()

    def step_end_s(self) -> float | None:
        """When its step under way ends (None between steps)."""
        return self.instance.step_end_s

    def result(self, metadata: dict[str, Any]) -> RunResult:
        """This instance's run: the requests routed to it and its steps."""
        return instance_result(self.config, self.requests, self.loop, self.tiers,
                               self.tier_links, {**metadata, "num_prompts": len(self.requests),
                                                 "instance": self.index},
                               self.instance.group_memory)


class _ClusterArrivals:
    """The cluster's requests yet to arrive, routed to an instance as each arrives: every
    instance's `ArrivalSource`."""

    __slots__ = ("_next", "_requests", "instance_of", "instances", "router")
    # `instances`: those arrivals are routed to (all, or the prefill ones)

    def __init__(self, requests: Sequence[Request], router: Router) -> None:
        self._requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self._next = 0
        self.router = router
        self.instances: list[ClusterInstance] = []
        self.instance_of: dict[int, int] = {}

    def next_arrival_s(self) -> float | None:
        """When the next request of the whole cluster arrives (None when all have)."""
        requests, index = self._requests, self._next
        return requests[index].arrival_s if index < len(requests) else None

    def deliver_until(self, now_s: float) -> None:
        """Route every request arrived by `now_s`, one by one in arrival order, each on the
        state the ones before it left (a routed request counts in its instance's load)."""
        requests, instances, choose = self._requests, self.instances, self.router.choose
        index = self._next
        while index < len(requests) and requests[index].arrival_s <= now_s:
            request = requests[index]
            chosen = instances[choose(request, instances)]
            chosen.submit(request)
            self.instance_of[request.request_id] = chosen.index
            index += 1
            self._next = index

    def process(self, env: simpy.Environment) -> Generator[simpy.Event, Any, None]:
        """SimPy process body: route at each distinct arrival time; at the end, wake every
        instance so that the idle ones see no more work is coming and stop."""
        yield from arrival_process(env, (r.arrival_s for r in self._requests),
                                   lambda: self.deliver_until(env.now))
        for instance in self.instances:
            instance.instance.wake()


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
        self.arrivals = _ClusterArrivals(self.requests, make_router(router, seed=router_seed))
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
        shapes = {(run.page_size, run.num_total_pages, run.num_host_pages) for run in runs}
        assert len(shapes) == 1, "the cluster's view needs instances of one memory shape"
        steps = StepRecorder()
        for run in runs:
            steps.extend(run.steps)
        metadata = {**metadata, **self._tier_stats()}
        whole = RunResult(
            requests=self.requests,
            steps=steps,
            itls_s=np.concatenate([run.itls_s for run in runs]),
            duration_s=duration_s(self.requests),
            page_size=runs[0].page_size,
            num_total_pages=runs[0].num_total_pages,
            kv_cache_size_tokens=runs[0].kv_cache_size_tokens,
            num_host_pages=runs[0].num_host_pages,
            metadata=metadata,
        )
        return ClusterResult(cluster=whole, instances=runs,
                             instance_of=dict(self.arrivals.instance_of),
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

    def _tier_stats(self) -> dict[str, Any]:
        """The instances' tier counters added up (pages, hits, stores, evictions, link time),
        each level's hit rate over the prompt tokens of all the scheduled requests; none
        without tiers. Each instance has its own tiers and its own share of a pool shared by
        them (its manager's `tier_stats`): the shares add up to the pool's counters, and the
        pool's pages count once."""
        instances = [i for i in self.instances if i.tiers is not None]
        if not instances:
            return {}
        total: dict[str, Any] = {}
        for instance in instances:
            for key, value in tier_stats(instance.manager, instance.tiers, instance.tier_links,
                                         instance.requests).items():
                total[key] = total.get(key, 0) + value
        for kind, pool in self.shared_tiers.items():  # one pool: its pages once, not N times
            total[f"{kind}_tier_pages"] = pool.num_device_pages
            level = [tier.kind for tier in instances[0].tiers or ()].index(kind)
            shares = TierStats()
            for instance in instances:
                shares.add(instance.manager.tier_stats[level])
            assert shares == pool.stats, f"the {kind} pool's counters differ from its shares"
        # rates: first-admission hits of every level over every scheduled prompt token
        prompt_tokens = scheduled_prompt_tokens(self.requests)
        levels = ["device_prefix_hit_rate_perc"] + [
            f"{tier.kind}_tier_hit_rate_perc" for tier in instances[0].tiers or ()]
        page_size = instances[0].manager.page_size
        for level, key in enumerate(levels):
            pages = sum(i.manager.first_hit_pages[level] for i in instances)
            total[key] = 100.0 * pages * page_size / prompt_tokens if prompt_tokens else 0.0
        return total
