"""A worker's traces, kept between the runs of a sweep or a `tune` bisection: the points of a
grid share a few traces, and reading and parsing one again per run was most of a run's own
overhead beside its simulation (a Trace is not changed by simulating it).

A trace is kept under its settings and its file's identity (resolved path, size, modification
time), so an edited file is read again; warnings its loading gave are given again on each use,
as a fresh load would. Workload specs (which may name other files) are not kept.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from kvlab.errors import KvlabError
from kvlab.traces import Trace, resolve_trace_path

MAX_TRACES = 8  # kept per process; the oldest goes first
_UNCACHED_DATASETS = ("workload",)
_traces: dict[str, tuple[Trace, list[warnings.WarningMessage]]] = {}


def _file_identity(path: object) -> list[Any] | None:
    """(resolved path, size, mtime) of a trace file; None for a path that is not one file."""
    try:
        found = resolve_trace_path(str(path)).resolve()
        stat = found.stat()
    except (OSError, KvlabError):  # (no such file, nor an excerpt of that name)
        return None
    return [str(found), stat.st_size, stat.st_mtime_ns] if found.is_file() else None


def _key(trace_settings: Mapping[str, Any]) -> str | None:
    if trace_settings.get("dataset_name") in _UNCACHED_DATASETS:
        return None
    path = trace_settings.get("dataset_path")
    identity = None if path is None else _file_identity(path)
    if path is not None and identity is None:
        return None  # the loader says what is wrong with it
    return json.dumps([sorted(trace_settings.items()), identity], default=repr)


def cached_trace(trace_settings: Mapping[str, Any], load: Callable[[], Trace]) -> Trace:
    """`load()`, or the trace it gave for the same settings and file before."""
    key = _key(trace_settings)
    if key is None:
        return load()
    if key not in _traces:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trace = load()
        if len(_traces) >= MAX_TRACES:
            del _traces[next(iter(_traces))]
        _traces[key] = (trace, caught)
    trace, caught = _traces[key]
    for message in caught:
        warnings.warn_explicit(message.message, message.category, message.filename,
                               message.lineno)
    return trace


def forget_traces() -> None:
    """Drop every kept trace."""
    _traces.clear()
