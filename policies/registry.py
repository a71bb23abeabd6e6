"""Registries of named policy implementations, one per family, with a one-line help each."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlab.policies.params import bind, split_spec

FAMILIES = (
    "allocation", "reserve", "block_sizing", "eviction", "victim", "preemption", "scheduling",
    "precision",
)


@dataclass(slots=True, frozen=True)
class Entry:
    """One registered implementation: its name, its help line and its factory."""

    family: str
    name: str
    help: str
    factory: Any


_REGISTRY: dict[str, dict[str, Entry]] = {family: {} for family in FAMILIES}


def register(family: str, name: str, *, help: str) -> Callable[[Any], Any]:
    """Class decorator: register an implementation of `family` under `name`."""
    assert family in _REGISTRY, family

    def decorate(factory: Any) -> Any:
        assert name not in _REGISTRY[family], f"{family} {name!r} registered twice"
        _REGISTRY[family][name] = Entry(family, name, help, factory)
        return factory

    return decorate


def names(family: str) -> list[str]:
    """Registered names of one family, in registration order."""
    _load_builtin()
    return list(_REGISTRY[family])


def get(family: str, name: str) -> Entry:
    """The entry for `name`; KeyError when it is not registered. `NAME:key=value,...` is
    NAME's entry whose factory passes those keyword parameters (`slru:protected_share=0.5`,
    kvlab.policies.params; KvlabError where they are wrong)."""
    _load_builtin()
    registered = _REGISTRY[family]
    entry = registered.get(name)
    if entry is not None:
        return entry
    base, items = split_spec(name, f"{family} {name!r}")
    entry = registered.get(base)
    if entry is None or not items:
        raise KeyError(name)
    params = bind(entry.factory, base, items, f"{family} {name!r}")
    return Entry(family, name, entry.help, functools.partial(entry.factory, **params))


def entries() -> list[Entry]:
    """Every registered implementation, family by family."""
    _load_builtin()
    return [entry for family in FAMILIES for entry in _REGISTRY[family].values()]


def _load_builtin() -> None:
    # Importing the family packages runs their @register decorators.
    from kvlab.policies import (  # noqa: F401
        allocation,
        block_sizing,
        eviction,
        precision,
        preemption,
        scheduling,
    )
