"""Scheduling-policy specs: `NAME[:key=value,...]` (e.g. `lpm:max_queue=256`), checked against
the registry, and the order object a spec names."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.params import split_spec
from kvlab.policies.scheduling.base import SchedulingOrder

DEFAULT_SCHEDULING_POLICY = "fcfs"


def scheduling_names() -> list[str]:
    """The registered scheduling orders, in registration order."""
    return registry.names("scheduling")


def make_order(spec: str) -> SchedulingOrder:
    """The scheduling order a spec names, its options set; a KvlabError about
    `scheduling_policy` for an unknown name, key or value."""
    text = spec.strip() if isinstance(spec, str) else spec
    if not isinstance(text, str):
        raise _error(f"scheduling_policy {spec!r}: expected a name such as fcfs or lpm")
    try:
        name, items = split_spec(text, f"scheduling_policy {spec!r}")
    except KvlabError as err:  # (named as the setting it is)
        raise _error(str(err)) from None
    names = scheduling_names()
    if name not in names:
        raise _error(f"scheduling_policy {spec!r}: unknown policy {name!r}; valid: "
                     f"{', '.join(names)}")
    factory = registry.get("scheduling", name).factory
    fields = {f.name: f for f in dataclasses.fields(factory)}
    options: dict[str, Any] = {}
    for key, value in items:
        if key not in fields:
            valid = ", ".join(fields) or "none"
            raise _error(f"scheduling_policy {spec!r}: {key!r} is not a key {name} takes "
                         f"(keys: {valid})")
        options[key] = _convert(spec, key, value, fields[key].default)
    order: SchedulingOrder = factory(**options)
    return order


def canonical_scheduling_policy(spec: str) -> str:
    """The spec as stored with results: the name, then each option that differs from its
    default (a KvlabError for a spec `make_order` rejects)."""
    order: Any = make_order(spec)  # (every registered order is a dataclass)
    name = spec.strip().partition(":")[0].strip()
    keys = [f"{f.name}={_format(getattr(order, f.name))}" for f in dataclasses.fields(order)
            if getattr(order, f.name) != f.default]
    return name + (":" + ",".join(keys) if keys else "")


def _convert(spec: str, key: str, value: str, default: Any) -> Any:
    """A whole number for an int option, seconds (or none) for a float one, checked >= 0."""
    if value.lower() in ("none", "") and not isinstance(default, int):
        return None
    try:
        number: float = int(value) if isinstance(default, int) else float(value)
    except ValueError:
        kind = "a whole number" if isinstance(default, int) else "a number of seconds or none"
        raise _error(f"scheduling_policy {spec!r}: {key}={value!r} is not {kind}") from None
    if not math.isfinite(number) or number < 0:
        raise _error(f"scheduling_policy {spec!r}: {key}={value!r} must be >= 0")
    return number


def _format(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _error(message: str) -> KvlabError:
    return KvlabError(message, parameters=("scheduling_policy",))
