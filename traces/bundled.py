"""The trace excerpts shipped in traces/data/ (sources and licences in data/ATTRIBUTION.md)."""

from __future__ import annotations

from pathlib import Path

from kvlab.errors import KvlabError

DATA_DIR = Path(__file__).resolve().parent / "data"

# name -> (file in DATA_DIR, dataset name of its loader)
_BUNDLED: dict[str, tuple[str, str]] = {
    "azure-conv": ("azure_conv_excerpt.csv", "azure"),
    "azure-code": ("azure_code_excerpt.csv", "azure"),
    "mooncake": ("mooncake_excerpt.jsonl", "mooncake"),
}

# The excerpt `load_trace(dataset_name)` uses when no path is given.
DEFAULT_EXCERPT: dict[str, str] = {"azure": "azure-conv", "mooncake": "mooncake"}


def bundled_traces() -> dict[str, Path]:
    """Every bundled excerpt by name, e.g. {'azure-conv': .../azure_conv_excerpt.csv}."""
    return {name: DATA_DIR / file for name, (file, _) in _BUNDLED.items()}


def bundled_trace_path(name: str) -> Path:
    """The file of the bundled excerpt `name`; a KvlabError lists the names when unknown."""
    if name not in _BUNDLED:
        raise KvlabError(f"no bundled trace {name!r}; bundled: {', '.join(_BUNDLED)}")
    return DATA_DIR / _BUNDLED[name][0]


def bundled_dataset_name(name: str) -> str:
    """The dataset name (loader) of a bundled excerpt."""
    bundled_trace_path(name)
    return _BUNDLED[name][1]


def bundled_name_of(path: Path) -> str | None:
    """The bundled name of `path` when it is one of the excerpts, else None."""
    try:
        resolved = path.resolve()
    except OSError:
        return None
    for name, (file, _) in _BUNDLED.items():
        if resolved == DATA_DIR / file:
            return name
    return None


def resolve_trace_path(path_or_name: str | Path) -> Path:
    """A trace file path: the path itself when it exists, else the bundled excerpt of that name."""
    path = Path(path_or_name)
    if path.exists():
        return path
    if str(path_or_name) in _BUNDLED:
        return bundled_trace_path(str(path_or_name))
    raise KvlabError(f"{path}: no such file, nor a bundled excerpt name "
                     f"({', '.join(_BUNDLED)})")
