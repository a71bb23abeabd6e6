"""Serving presets: the defaults of a serving engine's version, for the settings a user leaves
unset (`kvlab sim --preset`, the sweep setting `preset`).

The library's defaults are vLLM V1's (`vllm`, the default preset): recompute preemption of the
last admitted request, no admission watermark, a waiting request admitted only when its whole
prompt fits. `vllm-v0` is the V0 engine's scheduler: the last arrived request is the victim, 1%
of pages are kept free at admission, a request is admitted when its first chunk fits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies.spec import PolicySpec, named_policy_keys


@dataclass(slots=True, frozen=True)
class ServingPreset:
    """One engine version's defaults: `policy` keys (PolicySpec's) and `serving` settings
    (ServingConfig's fields) that apply where the user set nothing."""

    name: str
    description: str
    policy: dict[str, Any] = field(default_factory=dict)
    serving: dict[str, Any] = field(default_factory=dict)

    def apply(self, policy: str | dict[str, Any] | PolicySpec, spec: PolicySpec,
              settings: dict[str, Any], named: Collection[str] = ()) -> PolicySpec:
        """`spec` (parsed from `policy` by the caller, which parses each policy once) with
        this preset's keys where neither `policy` nor `named` (policy keys set otherwise, a
        sweep's grid) names them; `settings` (the ServingConfig keywords given) gains this
        preset's settings it lacks (changed in place)."""
        given = named_policy_keys(policy) | set(named)
        keys = {key: value for key, value in self.policy.items() if key not in given}
        for name, value in self.serving.items():
            if settings.get(name) is None:
                settings[name] = value
        return spec.with_options(**keys) if keys else spec


SERVING_PRESETS = {
    preset.name: preset for preset in (
        ServingPreset("vllm", "vLLM V1 (0.8 and later; 0.32 checked): recompute preemption of "
                      "the last admitted request, no admission watermark, a waiting request "
                      "admitted only when its whole prompt fits (the library's defaults)",
                      policy={"victim": "last-admitted", "watermark": 0.0},
                      serving={"scheduler_reserve_full_isl": True}),
        ServingPreset("vllm-v0", "vLLM V0's scheduler (the V0 engine, 0.7 and earlier): the "
                      "last arrived request is preempted, watermark 0.01 (pages kept free at "
                      "admission), a request admitted when its first chunk fits",
                      policy={"victim": "last-arrived", "watermark": 0.01},
                      serving={"scheduler_reserve_full_isl": False}),
    )
}
DEFAULT_SERVING_PRESET = "vllm"


def serving_preset(name: str | None) -> ServingPreset:
    """The preset of that name (None: the default, `vllm`); KvlabError naming the choices."""
    name = DEFAULT_SERVING_PRESET if name is None else name
    if name not in SERVING_PRESETS:
        raise KvlabError(f"preset {name!r}: expected one of {', '.join(SERVING_PRESETS)}",
                         parameters=("preset",))
    return SERVING_PRESETS[name]
