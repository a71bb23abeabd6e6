"""Policy specs: `KIND[:key=value,...]` strings, their validation, and JSON round trips."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.params import split_spec


@dataclass(slots=True, frozen=True)
class PolicySpec:
    """One memory policy: an allocation kind plus one choice from each other family.

    `block_size` is tokens per page. `reserve` applies to contiguous only (`max` = max_model_len,
    `pow2` = next power of two at or above the real total length, `oracle` = exactly it).
    `watermark` is the share of pages kept free when admitting new requests. `host_pages` bounds
    the swap space (None: as many host pages as device pages). `precision` demotes cold pages
    to lower precisions (policies/precision/; `age:recent=256,depth=2`, its keys after the
    name, the spec's own keys after them).
    """

    kind: str = "paged"
    block_size: int = 16
    reserve: str = "max"
    block_sizing: str = "fixed"
    eviction: str = "none"
    preemption: str = "recompute"
    victim: str = "last-admitted"  # vLLM V1's (the `vllm-v0` preset: last-arrived, 0.01)
    watermark: float = 0.0
    host_pages: int | None = None
    precision: str = "none"

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def prefix_caching(self) -> bool:
        """True when an eviction policy other than `none` keeps cached prefix pages."""
        return self.eviction != "none"

    def to_string(self) -> str:
        """The canonical spec string: the kind, then every key that differs from its default."""
        default = PolicySpec(kind=self.kind)
        keys = [
            f"{f.name}={_format(getattr(self, f.name))}"
            for f in fields(self)
            if f.name != "kind" and getattr(self, f.name) != getattr(default, f.name)
        ]
        return self.kind + (":" + ",".join(keys) if keys else "")

    def to_json(self) -> dict[str, Any]:
        """Every field, as a JSON-ready dict (`precision` only where it is not `none`, so that
        results written before it existed read the same)."""
        data = asdict(self)
        if data["precision"] == "none":
            del data["precision"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PolicySpec:
        """The spec a `to_json` dict describes; unknown keys are an error."""
        if not isinstance(data, dict):
            raise KvlabError(f"policy JSON must be an object, got {type(data).__name__}")
        _check_keys(data.keys(), with_kind=True)
        return cls(**data)

    def with_options(self, **changes: Any) -> PolicySpec:
        """A copy with some fields changed (validated)."""
        return replace(self, **changes)

    def __str__(self) -> str:
        return self.to_string()


def parse_policy(text: str | dict[str, Any] | PolicySpec) -> PolicySpec:
    """Parse `KIND[:key=value,...]` (or a JSON dict) into a validated `PolicySpec`.

    Example: `paged:block_size=16,eviction=lru,preemption=swap`. Unknown kinds, keys or values
    raise KvlabError listing the valid choices.
    """
    if isinstance(text, PolicySpec):
        return text
    if isinstance(text, dict):
        return PolicySpec.from_json(text)
    kind, items = split_spec(text, f"policy {text!r}")
    kinds = registry.names("allocation")
    if kind not in kinds:
        raise KvlabError(f"policy {text!r}: unknown kind {kind!r}; valid kinds: {', '.join(kinds)}")
    options: dict[str, Any] = {}
    last = None
    for key, value in items:
        if key not in _FIELD_NAMES and last is not None and ":" in str(options[last]):
            # A parameter of the family value before (`precision=age:recent=64,depth=2`).
            options[last] = f"{options[last]},{key}={value}"
            continue
        _check_keys([key], with_kind=False, context=text)
        options[key] = _convert(key, value, text)
        last = key
    return PolicySpec(kind=kind, **options)


_FIELD_NAMES = [f.name for f in fields(PolicySpec)]


def named_policy_keys(policy: str | dict[str, Any] | PolicySpec) -> set[str]:
    """The keys a policy names itself (`paged:victim=last-arrived` names victim; a JSON dict its
    keys; a PolicySpec the keys it holds at other than their defaults), which a serving preset
    leaves as they are."""
    if isinstance(policy, PolicySpec):
        default = PolicySpec(kind=policy.kind)
        return {f.name for f in fields(policy)
                if getattr(policy, f.name) != getattr(default, f.name)}
    if isinstance(policy, dict):
        return set(policy)
    return {key for key, _ in split_spec(policy, f"policy {policy!r}")[1] if key in _FIELD_NAMES}


def _check_keys(keys: Any, *, with_kind: bool, context: str = "") -> None:
    valid = _FIELD_NAMES if with_kind else _FIELD_NAMES[1:]
    for key in keys:
        if key not in valid:
            where = f"policy {context!r}: " if context else "policy: "
            raise KvlabError(f"{where}unknown key {key!r}; valid keys: {', '.join(valid)}")


def _convert(key: str, value: str, context: str) -> Any:
    try:
        if key == "block_size":
            return int(value)
        if key == "watermark":
            return float(value)
        if key == "host_pages":
            return None if value in ("none", "None", "") else int(value)
    except ValueError:
        expected = "a whole number" if key != "watermark" else "a number between 0 and 1"
        if key == "host_pages":
            expected += " of pages (host memory in bytes: --swap-space, e.g. 4GiB)"
        raise KvlabError(f"policy {context!r}: {key}={value!r} is not {expected}") from None
    return value


def _format(value: Any) -> str:
    return "none" if value is None else str(value)


def _validate(spec: PolicySpec) -> None:
    where = f"policy {spec.kind}"
    kinds = registry.names("allocation")
    if spec.kind not in kinds:
        raise KvlabError(f"unknown policy kind {spec.kind!r}; valid kinds: {', '.join(kinds)}")
    if not isinstance(spec.block_size, int) or spec.block_size < 1:
        raise KvlabError(f"{where}: block_size={spec.block_size!r} must be a whole number >= 1")
    for family, value in (
        ("reserve", spec.reserve),
        ("block_sizing", spec.block_sizing),
        ("eviction", spec.eviction),
        ("preemption", spec.preemption),
        ("victim", spec.victim),
        ("precision", spec.precision),
    ):
        valid = registry.names(family)
        if value not in valid and not _with_params(family, value, valid):
            raise KvlabError(f"{where}: {family}={value!r}; valid: {', '.join(valid)}")
    reserves_region = registry.get("allocation", spec.kind).factory.reserves_region
    if reserves_region and spec.block_sizing != "fixed":
        raise KvlabError(
            f"{where}: block_sizing={spec.block_sizing!r} does not apply to contiguous "
            "reservation (its size is set by reserve=max|pow2|oracle); use paged or buddy"
        )
    if not 0.0 <= spec.watermark < 1.0:
        raise KvlabError(f"{where}: watermark={spec.watermark!r} must be in [0, 1)")
    if spec.host_pages is not None and spec.host_pages < 0:
        raise KvlabError(f"{where}: host_pages={spec.host_pages!r} must be >= 0")


def _with_params(family: str, value: str, valid: list[str]) -> bool:
    """Whether `value` is a registered name with its own parameters (`slru:protected_share=0.5`,
    kvlab.policies.params); KvlabError where those parameters are wrong."""
    if value.partition(":")[0] not in valid:
        return False
    registry.get(family, value)
    return True
