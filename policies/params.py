"""A registered policy with its own parameters: `NAME[:key=value,...]`, the keys being the
keyword parameters of the policy's constructor (`slru:protected_share=0.5`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from kvlab.errors import KvlabError


def split_spec(text: str, where: str) -> tuple[str, list[tuple[str, str]]]:
    """`NAME[:key=value,...]` as (NAME, [(key, value), ...]), names and values stripped and
    a key's dashes as underscores. Raises KvlabError, prefixed by `where`, for an item that is
    not key=value."""
    name, _, rest = text.strip().partition(":")
    items = []
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise KvlabError(f"{where}: {item!r} is not key=value")
        items.append((key.strip().replace("-", "_"), value.strip()))
    return name.strip(), items


def parameters(factory: Callable[..., Any]) -> dict[str, Any]:
    """The keyword parameters a policy's constructor takes, with their defaults."""
    return {p.name: p.default for p in inspect.signature(factory).parameters.values()
            if p.default is not inspect.Parameter.empty}


def bind(factory: Callable[..., Any], name: str, items: list[tuple[str, str]],
         where: str) -> dict[str, Any]:
    """The keyword arguments `items` give `factory` (the policy `name`'s constructor), each
    converted to its default's type (a whole number where the default is None), checked by
    building the policy once. Raises KvlabError, prefixed by `where`, for a key the
    constructor lacks, a value of the wrong kind, or values the policy refuses (with its
    reason, where it gives one)."""
    accepted = parameters(factory)
    params: dict[str, Any] = {}
    for key, value in items:
        if key not in accepted:
            keys = ", ".join(accepted) or "none"
            raise KvlabError(f"{where}: {name} has no parameter {key!r}; its parameters: {keys}")
        params[key] = _convert(value, accepted[key], f"{where}: {key}")
    try:
        factory(**params)
    except (AssertionError, ValueError, TypeError) as error:
        shown = ",".join(f"{k}={v}" for k, v in params.items())
        reason = f": {error}" if str(error) else ""  # (the policy's own words, where it has any)
        raise KvlabError(f"{where}: {name} refuses these parameters ({shown}){reason}") from None
    return params


def _convert(value: str, default: Any, where: str) -> Any:
    """`value` as the type of the parameter's default (a whole number where it is None)."""
    if value.lower() == "none":
        return None
    try:
        if isinstance(default, float):
            return float(value)
        return int(value)
    except ValueError:
        expected = "a number" if isinstance(default, float) else "a whole number"
        raise KvlabError(f"{where}={value!r} is not {expected}") from None
