"""The plugin's one setting: `KVLAB_VLLM_EVICTION`, a kvlab eviction policy in kvlab's spec
grammar (`NAME[:key=value,...]`, the keys being the policy's own parameters:
kvlab.policies.params), the same string `kvlab sim --policy paged:eviction=...` takes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.interfaces import Eviction
from kvlab.policies.params import bind, split_spec

VARIABLE = "KVLAB_VLLM_EVICTION"


@dataclass(slots=True, frozen=True)
class EvictionChoice:
    """A registered eviction policy and the keyword arguments it is built with."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        """The canonical spec string: the name, then each parameter (sorted); what kvlab's
        registry builds again (`registry.get("eviction", spec)`)."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))

    def factory(self) -> Callable[[], Eviction]:
        """A new policy object per call (one per vLLM block pool)."""
        factory: Callable[[], Eviction] = registry.get("eviction", self.spec).factory
        return factory


def eviction_from_env(environ: Mapping[str, str]) -> EvictionChoice | None:
    """The policy `KVLAB_VLLM_EVICTION` asks for; None when it is unset or empty. Raises
    KvlabError naming the variable on a value kvlab cannot build."""
    text = environ.get(VARIABLE, "").strip()
    return parse_eviction(text) if text else None


def parse_eviction(text: str) -> EvictionChoice:
    """Parse `NAME[:key=value,...]` into a policy kvlab can build (built once here, so a bad
    parameter fails at start). Raises KvlabError naming `KVLAB_VLLM_EVICTION`."""
    where = f"{VARIABLE}={text!r}"
    name, items = split_spec(text, where)
    valid = [n for n in registry.names("eviction") if n != "none"]
    if name == "none":
        raise KvlabError(f"{VARIABLE}=none: to turn vLLM's prefix cache off, start it with "
                         f"--no-enable-prefix-caching and unset {VARIABLE}")
    if name not in valid:
        raise KvlabError(f"{where}: unknown eviction policy {name!r}; valid: {', '.join(valid)}")
    return EvictionChoice(name, bind(registry.get("eviction", name).factory, name, items, where))
