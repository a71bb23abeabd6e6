"""What a sweep runs: `SweepSpec` (settings for every run, a grid of values, an optional random
sample of it), read from a YAML file or `key=v1,v2` texts, and expanded into points."""

from __future__ import annotations

import difflib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.sweep.settings import SETTINGS, setting_value

FILE_KEYS = ("base", "grid", "sample", "sample_seed")


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A sweep: `base` settings shared by every run, and `grid`, the values of each swept
    setting; the runs are every combination of the grid's values (the last setting varying
    fastest), or `sample` of them drawn without replacement with `sample_seed`.

    Values are checked settings (`kvlab.sweep.settings`); a grid setting overrides the same
    base setting. Construct with `create`, which checks them.
    """

    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    sample: int | None = None
    sample_seed: int = 0

    @classmethod
    def create(cls, base: Mapping[str, Any] | None = None,
               grid: Mapping[str, Sequence[Any]] | None = None, *, sample: int | None = None,
               sample_seed: int = 0) -> SweepSpec:
        """A checked spec: every setting read and checked, repeated grid values dropped."""
        checked_base = {name: setting_value(name, value) for name, value in (base or {}).items()}
        checked_grid = {name: grid_values(name, values) for name, values in (grid or {}).items()}
        _check_sample(sample, sample_seed)
        return cls(checked_base, checked_grid, sample, sample_seed)

    @property
    def grid_size(self) -> int:
        """How many combinations the grid has (1 without a grid: the base alone)."""
        return math.prod(len(values) for values in self.grid.values())

    def points(self) -> list[dict[str, Any]]:
        """The settings of each run: the base with one combination of the grid each, in grid
        order; with `sample`, that many distinct combinations chosen at random (seeded),
        in grid order."""
        size = self.grid_size
        if self.sample is None or self.sample >= size:
            indices: Sequence[int] = range(size)
        else:
            indices = sorted(random.Random(self.sample_seed).sample(range(size), self.sample))
        return [{**self.base, **self.combination(index)} for index in indices]

    def combination(self, index: int) -> dict[str, Any]:
        """The grid's combination number `index` (0 <= index < grid_size), in grid order."""
        names = list(self.grid)
        choice: dict[str, Any] = {}
        for name in reversed(names):
            values = self.grid[name]
            index, position = divmod(index, len(values))
            choice[name] = values[position]
        return {name: choice[name] for name in names}


def _check_sample(sample: int | None, sample_seed: int) -> None:
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int)
                               or sample < 1):
        raise KvlabError(f"sample {sample!r}: expected a whole number of runs >= 1",
                         parameters=("sample",))
    if isinstance(sample_seed, bool) or not isinstance(sample_seed, int) or sample_seed < 0:
        raise KvlabError(f"sample_seed {sample_seed!r}: expected a whole number >= 0",
                         parameters=("sample_seed",))


def grid_values(name: str, values: Sequence[Any] | Any) -> list[Any]:
    """The checked, distinct values of grid setting `name` (a single value is a list of one)."""
    if name in SETTINGS and not SETTINGS[name].sweepable:
        raise KvlabError(f"{name} shapes every row's columns and cannot vary within a sweep; "
                         "set it once for the whole sweep (a base setting)")
    items = list(values) if isinstance(values, (list, tuple)) else [values]
    if not items:
        raise KvlabError(f"{name}: give at least one value")
    checked: list[Any] = []
    for item in items:
        value = setting_value(name, item)
        if value not in checked:
            checked.append(value)
    return checked


def _policy_kinds() -> set[str]:
    return set(registry.names("allocation"))


def split_values(name: str, text: str) -> list[str]:
    """The comma-separated values of `name` in `text`; for `policy` and `precision`, whose
    values take `key=value` options after a colon, a comma followed by an option continues the
    value before it: `paged:block_size=32,eviction=lru,buddy` is two policies,
    `age:recent=32,depth=2,age:recent=128` two precision policies."""
    pieces = [piece.strip() for piece in text.split(",")]
    if name not in ("policy", "precision"):
        return [piece for piece in pieces if piece]
    kinds = _policy_kinds() if name == "policy" else set()
    specs: list[str] = []
    for piece in filter(None, pieces):
        head = piece.split(":", 1)[0].strip()
        if specs and "=" in head and head.split("=", 1)[0].strip() not in kinds:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def parse_grid_item(text: str) -> tuple[str, list[Any]]:
    """One `KEY=V1,V2,...` grid text: the setting's name and its checked values."""
    name, eq, values = text.partition("=")
    name = name.strip().replace("-", "_")
    if not eq or not name:
        raise KvlabError(f"{text!r} is not KEY=V1,V2,... (e.g. block_size=16,32)")
    check_name(name)
    items = split_values(name, values)
    if not items:
        raise KvlabError(f"{name}: give at least one value after '=', comma-separated")
    return name, grid_values(name, items)


def check_name(name: str) -> None:
    """A KvlabError unless `name` is a setting; it suggests the closest names."""
    if name in SETTINGS:
        return
    close = difflib.get_close_matches(name, SETTINGS, n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    keys = ", ".join(setting.name for setting in SETTINGS.values() if setting.group == "policy")
    raise KvlabError(f"unknown setting {name!r}; {hint}a sweep varies the flags of `kvlab sim` "
                     f"(their names without the dashes, e.g. max_num_seqs) and the policy keys "
                     f"({keys})")


def load_sweep_file(path: str | Path) -> SweepSpec:
    """The SweepSpec of a YAML file with `base:` (settings of every run), `grid:` (setting:
    list of values), and optionally `sample:` and `sample_seed:`; a KvlabError names the file
    and the line of the first problem."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise KvlabError(f"{path}: cannot read the sweep file ({err})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise KvlabError(f"{path}{where}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()
    if node is None or not isinstance(data, dict):
        raise KvlabError(f"{path}: expected a mapping with {', '.join(FILE_KEYS)}, e.g. "
                         "grid: {block_size: [16, 32]}")
    return _spec_from_yaml(path, node, data)


def _line(node: Any) -> int:
    return int(node.start_mark.line) + 1


def _entries(node: Any) -> dict[str, tuple[Any, Any]]:
    """The (key, value) nodes of a YAML mapping node by key text."""
    return {str(key.value): (key, value) for key, value in node.value}


def _spec_from_yaml(path: Path, node: Any, data: dict[str, Any]) -> SweepSpec:
    nodes = _entries(node)

    def fail(at: Any, message: str) -> KvlabError:
        return KvlabError(f"{path}, line {_line(at)}: {message}")

    for key in data:
        if key not in FILE_KEYS:
            raise fail(nodes[str(key)][0], f"unknown section {key!r}; expected "
                       f"{', '.join(FILE_KEYS)}")
    sections: dict[str, dict[str, Any]] = {}
    for section in ("base", "grid"):
        value = data.get(section) or {}
        if not isinstance(value, dict):
            raise fail(nodes[section][1], f"{section} must be a mapping of settings")
        sections[section] = value
    base: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    for section, target in (("base", base), ("grid", grid)):
        entries = _entries(nodes[section][1]) if sections[section] else {}
        for name, value in sections[section].items():
            key_node, at = entries[str(name)]
            try:
                try:
                    check_name(str(name))
                except KvlabError as err:
                    raise fail(key_node, str(err)) from None
                if section == "base":
                    target[name] = setting_value(name, value)
                else:
                    target[name] = _yaml_grid_values(path, name, value, at)
            except KvlabError as err:
                if str(err).startswith(f"{path}, line"):
                    raise
                raise fail(at, str(err)) from None
    try:
        return SweepSpec.create(base, grid, sample=data.get("sample"),
                                sample_seed=data.get("sample_seed", 0))
    except KvlabError as err:
        name = "sample_seed" if "sample_seed" in str(err) else "sample"
        raise fail(nodes[name][1] if name in nodes else node, str(err)) from None


def _yaml_grid_values(path: Path, name: str, value: Any, at: Any) -> list[Any]:
    """A grid entry's values, a bad one named with its own line."""
    if not isinstance(value, list):
        return grid_values(name, value)
    for item, item_node in zip(value, at.value, strict=True):
        try:
            grid_values(name, [item])
        except KvlabError as err:
            raise KvlabError(f"{path}, line {_line(item_node)}: {err}") from None
    return grid_values(name, value)

