"""The plugin's one setting: `KVLAB_VLLM_EVICTION`, a kvlab eviction policy in kvlab's spec
grammar (`NAME[:key=value,...]`, the keys being the policy's own parameters)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.interfaces import Eviction
from kvlab.policies.spec import split_spec

VARIABLE = "KVLAB_VLLM_EVICTION"


@dataclass(slots=True, frozen=True)
class EvictionChoice:
    """A registered eviction policy and the keyword arguments it is built with."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        """The canonical spec string: the name, then each parameter (sorted)."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))

    def factory(self) -> Callable[[], Eviction]:
        """A new policy object per call (one per vLLM block pool)."""
        entry = registry.get("eviction", self.name)
        params = dict(self.params)
        return lambda: entry.factory(**params)  # type: ignore[no-any-return]


def eviction_from_env(environ: Mapping[str, str]) -> EvictionChoice | None:
    """The policy `KVLAB_VLLM_EVICTION` asks for; None when it is unset or empty. Raises
    KvlabError naming the variable on a value kvlab cannot build."""
    text = environ.get(VARIABLE, "").strip()
    return parse_eviction(text) if text else None


def parse_eviction(text: str) -> EvictionChoice:
    """Parse `NAME[:key=value,...]` into a policy kvlab can build (built once here, so a bad
    parameter fails at start). Raises KvlabError naming `KVLAB_VLLM_EVICTION`."""
    name, items = split_spec(text, f"{VARIABLE}={text!r}")
    valid = [n for n in registry.names("eviction") if n != "none"]
    if name == "none":
        raise KvlabError(f"{VARIABLE}=none: to turn vLLM's prefix cache off, start it with "
                         f"--no-enable-prefix-caching and unset {VARIABLE}")
    if name not in valid:
        raise KvlabError(f"{VARIABLE}={text!r}: unknown eviction policy {name!r}; valid: "
                         f"{', '.join(valid)}")
    factory = registry.get("eviction", name).factory
    accepted = {p.name: p.default for p in inspect.signature(factory).parameters.values()
                if p.default is not inspect.Parameter.empty}
    params: dict[str, Any] = {}
    for key, value in items:
        if key not in accepted:
            keys = ", ".join(accepted) or "none"
            raise KvlabError(f"{VARIABLE}={text!r}: {name} has no parameter {key!r}; its "
                             f"parameters: {keys}")
        params[key] = _convert(value, accepted[key], f"{VARIABLE}={text!r}: {key}")
    choice = EvictionChoice(name, params)
    try:
        choice.factory()()
    except (AssertionError, ValueError, TypeError):
        raise KvlabError(f"{VARIABLE}={text!r}: {name} refuses these parameters "
                         f"({choice.spec})") from None
    return choice


def _convert(value: str, default: Any, where: str) -> Any:
    """`value` as the type of the parameter's default (a number where the default is None)."""
    if value.lower() == "none":
        return None
    try:
        if isinstance(default, float):
            return float(value)
        return int(value)
    except ValueError:
        expected = "a number" if isinstance(default, float) else "a whole number"
        raise KvlabError(f"{where}={value!r} is not {expected}") from None
