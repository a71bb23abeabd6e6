"""What a setting is (`Setting`: one declaration of a run's setting) and the small readers and
checks the table in `kvlab.sweep.settings` builds its settings from."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.errors import KvlabError
from kvlab.metrics import parse_goodput
from kvlab.policies import PolicySpec
from kvlab.policies.scheduler_config import check_whole_number
from kvlab.policies.serving import ServingConfig, parse_memory_size
from kvlab.policies.tiers import AUTO_BLOCK

# Where a setting goes: the trace loader, the machine (SimConfig), the serving config, the
# policy spec's own keys, the memory tiers, the summary's options, or the cluster
# (simulate_cluster).
GROUPS = ("trace", "machine", "serving", "policy", "tiers", "summary", "cluster")


# How a setting's command-line flag takes its value: `value` (one value, read by `cli_type`),
# `switch` (present: True), `toggle` (--flag / --no-flag), `off` (present: False, a --disable-
# flag) or `list` (one or more values).
ACTIONS = ("value", "switch", "toggle", "off", "list")


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of a run, declared once: where it goes, how a value is read and checked,
    and its flag, default and help, from which `kvlab`'s flags, the sweep's settings and the
    dashboard's widgets are made.

    `convert` turns a YAML value or a command-line text into the setting's type (a ValueError
    saying what it expected when it cannot); `check` raises a KvlabError for a value the
    library rejects. `sweepable` is False for the summary's options, which shape every row's
    columns and are set once for the whole sweep. `flag` is the command-line flag (None: the
    setting has none, as the policy's own keys), `default` the value of an unset setting on
    the command line, `help` the flag's help (a function where it lists a registry, read
    when a parser is made), `metavar` the flag's value name, its unit where it has one.
    """

    name: str
    group: str
    convert: Callable[[Any], Any]
    check: Callable[[Any], object] | None = None
    sweepable: bool = True
    flag: str | None = None
    help: str | Callable[[], str] = ""
    default: Any = None
    action: str = "value"
    cli_type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: Callable[[], Sequence[str]] | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert self.action in ACTIONS, f"setting {self.name}: action {self.action!r}"

    def help_text(self) -> str:
        """The help, with any registry listed now."""
        return self.help() if callable(self.help) else self.help


def flag_of(name: str) -> str:
    """A setting's usual flag: its name with dashes (`max_num_seqs`: `--max-num-seqs`)."""
    return "--" + name.replace("_", "-")


def as_int(value: Any) -> int:
    """A whole number from a YAML number or text."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise ValueError("expected a whole number")


def as_float(value: Any) -> float:
    """A number from a YAML number or text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError("expected a number")


def as_bool(value: Any) -> bool:
    """True or false from a YAML boolean or text (yes/no, on/off, 1/0)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError("expected true or false")


def as_str(value: Any) -> str:
    """Text, stripped (a YAML mapping, list, boolean or null is no text)."""
    if isinstance(value, (dict, list, bool)) or value is None:
        raise ValueError("expected text")
    return str(value).strip()


def optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`convert`, with None (YAML null, or the text none/null) meaning unset."""

    def read(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        return convert(value)

    return read


def tier_block_size(value: Any) -> int | str | None:
    """A tier page size: tokens, `auto`, or none (YAML null, or the text none/page: one
    device page)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in
                         ("none", "null", "page")):
        return None
    if isinstance(value, str) and value.strip().lower() == AUTO_BLOCK:
        return AUTO_BLOCK
    try:
        return as_int(value)
    except ValueError:
        raise ValueError("expected a number of tokens, auto or none") from None


def tier_block_text(text: str) -> str:
    """The flag's text of a tier page size, as given, once `tier_block_size` reads it (an
    argparse error saying what was expected otherwise)."""
    try:
        tier_block_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}, not {text!r}") from None
    return text


def text_list(value: Any) -> str:
    """A list given as YAML list or comma-separated text, as the flag's comma-separated text."""
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return as_str(value)


def goodput_slos(value: Any) -> dict[str, float] | None:
    """SLOs as {metric: ms} from a YAML mapping, a list of KEY:MS, or text `ttft:500 tpot:50`."""
    if value is None:
        return None
    if isinstance(value, dict):
        items = [f"{key}:{ms}" for key, ms in value.items()]
    elif isinstance(value, list):
        items = [str(item) for item in value]
    else:
        items = str(value).replace(",", " ").split()
    return parse_goodput(items)


def swap_space(value: Any) -> int:
    """Swap space in bytes from GiB (a bare number, as vLLM's --swap-space) or a size."""
    return parse_memory_size(value if isinstance(value, (int, str)) else as_str(value),
                             "swap_space_bytes", bare_unit="gib")


def kv_cache_memory(value: Any) -> int | None:
    """KV cache bytes from a size (256MiB, 2GiB); None or "none": from the utilisation."""
    if value is None or value == "none":
        return None
    return parse_memory_size(value if isinstance(value, (int, str)) else as_str(value))


def policy_key(name: str) -> Callable[[Any], object]:
    """The check of a policy key: the PolicySpec it makes."""
    return lambda value: PolicySpec(**{name: value})


def serving_field(name: str) -> Callable[[Any], object]:
    """The check of a ServingConfig field: the ServingConfig it makes."""
    return lambda value: ServingConfig(**{name: value})


def whole(name: str, low: int) -> Callable[[Any], object]:
    """The check of a whole number >= `low`."""
    return lambda value: check_whole_number(name, value, low)


def optional_whole(name: str, low: int) -> Callable[[Any], object]:
    """The check of None or a whole number >= `low`."""
    return lambda value: None if value is None else check_whole_number(name, value, low)


def choice(name: str, choices: tuple[str, ...] | list[str]) -> Callable[[Any], object]:
    """The check of one of `choices`."""
    def check(value: Any) -> None:
        if value not in choices:
            raise KvlabError(f"{name} {value!r}: expected one of {', '.join(choices)}",
                             parameters=(name,))

    return check


def positive(name: str, *, finite: bool = True) -> Callable[[Any], object]:
    """The check of a number > 0 (finite unless `finite` is False)."""
    def check(value: Any) -> None:
        if math.isnan(value) or value <= 0 or (finite and math.isinf(value)):
            raise KvlabError(f"{name} {value!r}: expected a number > 0", parameters=(name,))

    return check


def fraction(name: str) -> Callable[[Any], object]:
    """The check of a share in [0, 1]."""
    def check(value: Any) -> None:
        if not 0.0 <= value <= 1.0:
            raise KvlabError(f"{name} {value!r}: expected a share in [0, 1]", parameters=(name,))

    return check
