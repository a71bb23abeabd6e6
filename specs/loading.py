"""Look up a model or hardware spec by preset name, or read one from a user's YAML/JSON file."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml  # type: ignore[import-untyped, unused-ignore]  # stubs: types-PyYAML

from kvlab.errors import KvlabError
from kvlab.specs.hardware import HardwareSpec
from kvlab.specs.hf import is_hf_folder, model_spec_from_hf
from kvlab.specs.kv_layout import layer_layout_problem
from kvlab.specs.model import ModelSpec
from kvlab.specs.presets import HARDWARE_ALIASES, HARDWARE_PRESETS, MODEL_PRESETS

SpecT = TypeVar("SpecT", ModelSpec, HardwareSpec)

SPEC_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def list_models() -> dict[str, ModelSpec]:
    """Every model preset, by name."""
    return dict(MODEL_PRESETS)


def list_hardware() -> dict[str, HardwareSpec]:
    """Every hardware preset, by name."""
    return dict(HARDWARE_PRESETS)


def get_model(name_or_path: str) -> ModelSpec:
    """A model preset by name (or by a Hugging Face id or served name of it,
    `preset_of_served_name`), a Hugging Face model folder (its config.json), or a ModelSpec
    read from a YAML or JSON spec file."""
    path = Path(name_or_path)
    if name_or_path.lower() not in MODEL_PRESETS and is_hf_folder(path):
        return model_spec_from_hf(path)
    preset = preset_of_served_name(name_or_path)
    if preset is not None and not path.exists():
        return MODEL_PRESETS[preset]
    return _get(name_or_path, MODEL_PRESETS, ModelSpec, "model")


# What a Hugging Face id or a served name adds to a preset's name (tuned variants of it)
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-hf", "-it", "-base")


def preset_of_served_name(name: str) -> str | None:
    """The model preset a Hugging Face id or a served model name is a variant of
    (`meta-llama/Llama-3.1-8B-Instruct` -> `llama-3.1-8b`, `google/gemma-3-27b-it` ->
    `gemma-3-27b`), or None: the name after its last `/`, lower case, less a variant
    suffix."""
    base = name.rsplit("/", 1)[-1].lower()
    for suffix in _VARIANT_SUFFIXES:
        if base.endswith(suffix) and base[: -len(suffix)] in MODEL_PRESETS:
            return base[: -len(suffix)]
    return base if base in MODEL_PRESETS and base != name.lower() else None


def get_hardware(name_or_path: str) -> HardwareSpec:
    """A hardware preset by name (or a short alias such as `h200`), or a HardwareSpec read from
    a YAML or JSON file path."""
    name = HARDWARE_ALIASES.get(name_or_path.lower(), name_or_path)
    return _get(name, HARDWARE_PRESETS, HardwareSpec, "hardware")


def _get(name_or_path: str, presets: dict[str, SpecT], cls: type[SpecT], kind: str) -> SpecT:
    if name_or_path.lower() in presets:
        return presets[name_or_path.lower()]
    path = Path(name_or_path)
    if path.is_dir():
        raise KvlabError(f"{path}: a folder without config.json (a {kind} is a preset name, "
                         f"a .yaml/.json spec file"
                         + (", or a Hugging Face model folder)" if kind == "model" else ")"),
                         parameters=(kind,))
    if path.suffix.lower() in SPEC_FILE_SUFFIXES or path.exists():
        return _load_file(path, cls, kind)
    raise KvlabError(
        f"unknown {kind} preset {name_or_path!r}; choose from: {', '.join(presets)} "
        f"(or give a .yaml/.json file with the {kind} fields"
        + (", or a Hugging Face model folder" if kind == "model" else "") + ")"
    )


def _load_file(path: Path, cls: type[SpecT], kind: str) -> SpecT:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise KvlabError(f"cannot read {kind} file {path}: {err.strerror or err}") from err
    except UnicodeDecodeError:
        raise KvlabError(f"{path}: not a text file; expected a YAML or JSON spec file",
                         parameters=(kind,)) from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise KvlabError(f"{path} line {err.lineno}, column {err.colno}: not valid JSON "
                         f"({err.msg})") from None
    except yaml.YAMLError as err:
        raise KvlabError(f"{path}{_yaml_where(err)}: not valid YAML ({_yaml_problem(err)})"
                         ) from None
    if not isinstance(data, dict):
        raise KvlabError(f"{path}: expected a mapping of {kind} fields, got {type(data).__name__}")
    return _build(data, path, cls)


def _build(data: dict[str, Any], path: Path, cls: type[SpecT]) -> SpecT:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    valid = ", ".join(fields)
    unknown = [key for key in data if key not in fields]
    if unknown:
        raise KvlabError(f"{path}: unknown field {unknown[0]!r}; valid fields: {valid}")
    # A file that omits its name is named after itself.
    values = {"name": path.stem, **data}
    missing = [
        name
        for name, f in fields.items()
        if name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise KvlabError(f"{path}: missing field {missing[0]!r}; valid fields: {valid}")
    hints = get_type_hints(cls)
    kwargs = {name: _coerce(value, hints[name], path, name) for name, value in values.items()}
    spec = cls(**kwargs)
    _check_values(spec, path)
    return spec


def _coerce(value: Any, hint: Any, path: Path, field: str) -> Any:
    """Check one field's value against its annotation; accept numbers YAML read as strings."""
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)
    if value is None and optional:
        return None
    base = next(a for a in get_args(hint) if a is not type(None)) if optional else hint
    if get_origin(base) is tuple:  # layer_types: a list of words
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise KvlabError(f"{path}: field {field!r} is {value!r}, expected a list of words")
    if base is str:
        if isinstance(value, str):
            return value
        raise KvlabError(f"{path}: field {field!r} is {value!r}, expected text")
    number = _as_number(value)
    if number is None:
        raise KvlabError(f"{path}: field {field!r} is {value!r}, expected a number")
    if base is int:
        if number != int(number):
            raise KvlabError(f"{path}: field {field!r} is {value!r}, expected a whole number")
        return int(number)
    return float(number)


def _as_number(value: Any) -> float | None:
    # PyYAML reads 1.6e12 (no dot, no exponent sign) as a string, so accept numeric strings.
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return None
    return None


def _check_values(spec: ModelSpec | HardwareSpec, path: Path) -> None:
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        # Latencies and overheads may be zero (an ideal link, CUDA graphs); sizes may not.
        floor_ok = f.name.endswith("_s") and value == 0
        if isinstance(value, int | float) and value <= 0 and not floor_ok:
            raise KvlabError(f"{path}: field {f.name!r} is {value}, expected a positive number")
    if isinstance(spec, ModelSpec):
        problem = model_problem(spec)
        if problem:
            raise KvlabError(f"{path}: {problem}")


def model_problem(spec: ModelSpec) -> str | None:
    """What makes a model spec inconsistent, or None when it is sound."""
    if spec.num_heads % spec.num_kv_heads:
        return f"num_heads {spec.num_heads} is not a multiple of num_kv_heads {spec.num_kv_heads}"
    if spec.num_active_params > spec.num_params:
        return (
            f"num_active_params {spec.num_active_params:g} exceeds num_params {spec.num_params:g}"
        )
    if (spec.kv_lora_rank is None) != (spec.qk_rope_head_dim is None):
        return "kv_lora_rank and qk_rope_head_dim go together (MLA): give both or neither"
    return layer_layout_problem(spec)


def _yaml_where(err: yaml.YAMLError) -> str:
    """' line L, column C' of a YAML error's problem (or its context), '' without a mark."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    return "" if mark is None else f" line {mark.line + 1}, column {mark.column + 1}"


def _yaml_problem(err: yaml.YAMLError) -> str:
    """The parser's one-line reason, without its quoted source excerpt."""
    parts = [getattr(err, "context", None), getattr(err, "problem", None)]
    text = "; ".join(p for p in parts if p)
    return text or str(err).splitlines()[0]
