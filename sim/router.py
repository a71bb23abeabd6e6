"""Routers of a simulated cluster: which instance a request goes to, decided when it arrives.

A router sees each candidate instance through `RoutedInstance` (its load and its prefix cache,
both read without changing anything) and returns the position of its choice among them. Ties
always go to the first candidate, so a run is deterministic; `power-of-two` draws from a RNG
seeded once per run.

Load is the number of requests an instance holds: routed but not yet admitted, waiting,
running and swapped out. It is counted in requests, not pages, on purpose: a request count
changes only when a step is committed, and a run of decode steps committed at once
(`SimInstance`'s fast path) changes none of them before its end, so routing is the same with
or without the fast path (used pages would differ inside a run).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvlab.errors import KvlabError
from kvlab.policies import Request


class RoutedInstance(Protocol):
    """What a router reads of one instance."""

    def num_requests(self) -> int:
        """Requests the instance holds: routed and not yet admitted, waiting, running, swapped."""
        ...

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """Leading prompt tokens of `request` whose KV the instance's prefix cache holds now
        (0 without prefix caching); reads the cache without changing it."""
        ...


class Router(Protocol):
    """Chooses an instance for each arriving request."""

    def choose(self, request: Request, instances: Sequence[RoutedInstance]) -> int:
        """The position in `instances` (never empty) of the one `request` goes to."""
        ...


@dataclass(slots=True, frozen=True)
class RouterEntry:
    """A registered router: its name, help line and factory (called with the run's seed)."""

    name: str
    help: str
    factory: Callable[[int], Router]


_ROUTERS: dict[str, RouterEntry] = {}


def register_router(name: str, *, help: str) -> Callable[[type], type]:
    """Class decorator: register a router class (constructed with `seed=`) under `name`."""

    def decorate(cls: type) -> type:
        assert name not in _ROUTERS, f"router {name!r} registered twice"
        _ROUTERS[name] = RouterEntry(name, help, lambda seed: cls(seed=seed))
        return cls

    return decorate


def router_names() -> list[str]:
    """The registered routers' names, in registration order."""
    return list(_ROUTERS)


def check_router(name: str) -> str:
    """`name` when a router of that name is registered; else a KvlabError listing them."""
    if name not in _ROUTERS:
        raise KvlabError(f"router is {name!r}; expected one of {', '.join(_ROUTERS)}",
                         parameters=("router",))
    return name


def make_router(name: str, *, seed: int = 0) -> Router:
    """A fresh router of that name for one run (its own round-robin turn or RNG)."""
    return _ROUTERS[check_router(name)].factory(seed)


@register_router("round-robin", help="each instance in turn, whatever its state")
@dataclass(slots=True)
class RoundRobinRouter:
    """Instance 0, 1, ..., N-1, 0, ... in arrival order."""

    seed: int = 0  # unused: round-robin draws nothing
    _turn: int = 0

    def choose(self, request: Request, instances: Sequence[RoutedInstance]) -> int:
        """The next instance in turn."""
        position = self._turn % len(instances)
        self._turn += 1
        return position


@register_router("least-loaded",
                 help="the instance holding the fewest requests (routed, waiting, running, "
                 "swapped); ties: the first")
@dataclass(slots=True)
class LeastLoadedRouter:
    """The instance with the fewest requests; ties by position."""

    seed: int = 0  # unused: no randomness

    def choose(self, request: Request, instances: Sequence[RoutedInstance]) -> int:
        """The least-loaded instance."""
        loads = [instance.num_requests() for instance in instances]
        return loads.index(min(loads))


@register_router("prefix-aware",
                 help="the instance whose prefix cache holds the longest prefix of the prompt; "
                 "ties: the least loaded, then the first")
@dataclass(slots=True)
class PrefixAwareRouter:
    """The instance whose prefix cache holds the longest leading part of the prompt (ties by
    load, then position).

    It reads the caches as they are when the request arrives, not the requests routed but not
    yet computed: two requests with one new prefix arriving together may go to different
    instances. Without prefix caching every hit is 0 and this is `least-loaded`.
    """

    seed: int = 0  # unused: no randomness

    def choose(self, request: Request, instances: Sequence[RoutedInstance]) -> int:
        """The instance with the longest cached prefix of `request`."""
        keys = [(-instance.num_cached_prefix_tokens(request), instance.num_requests(), position)
                for position, instance in enumerate(instances)]
        return min(keys)[2]


@register_router("power-of-two",
                 help="two instances drawn at random (seeded), the less loaded of them; "
                 "ties: the first")
@dataclass(slots=True)
class PowerOfTwoRouter:
    """The less loaded of two distinct instances drawn from a RNG seeded with `seed` (the
    power of two choices); ties by position."""

    seed: int = 0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, request: Request, instances: Sequence[RoutedInstance]) -> int:
        """The less loaded of two random instances."""
        if len(instances) == 1:
            return 0
        first, second = sorted(self._rng.sample(range(len(instances)), 2))
        if instances[second].num_requests() < instances[first].num_requests():
            return second
        return first
