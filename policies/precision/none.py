"""No demotion: every page stays at the cache's dtype (the default)."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.policies.registry import register


@register("precision", "none", help="every KV page stays at the cache's dtype (default)")
@dataclass(slots=True, frozen=True)
class NoDemotion:
    """The default: nothing is demoted, and the manager runs without a precision driver."""

    demotes = False
