"""One instance of a simulated cluster (`kvlab.sim.cluster`): what it runs and its role
(`InstanceSpec`), and its parts built as `simulate` builds its one instance, with what a router
reads of it (`ClusterInstance`).

An instance has a role and its own config: "mixed" instances prefill and decode; with
prefill/decode disaggregation, "prefill" instances hand each request's KV to a "decode" one
(`kvlab.sim.disaggregation`). A remote memory tier is one pool shared by every instance (each
reaches it over its own link); host and SSD tiers are each instance's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from kvlab.errors import KvlabError
from kvlab.metrics import RunResult
from kvlab.policies import Request, Scheduler, StepLoop
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.policies.tiers import PrefixTier, build_tier
from kvlab.sim.assembly import (
    build_manager,
    build_tier_links,
    default_cost_model,
    instance_result,
    instance_tiers,
)
from kvlab.sim.config import SimConfig
from kvlab.sim.cost_model import CostModel
from kvlab.sim.disaggregation import Handoffs
from kvlab.sim.instance import ArrivalSource, SimInstance
from kvlab.sim.link import HostLink

# What an instance does: both stages, or one of them (prefill/decode disaggregation).
ROLES = ("mixed", "prefill", "decode")


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
