"""Loader for Mooncake traces: JSON lines of timestamp, input_length, output_length, hash_ids.

`timestamp` is milliseconds since the start of the trace; `hash_ids[i]` names the i-th 512-token
prompt block together with everything before it, so a row must carry ceil(input_length / 512) ids.
Optional fields: `priority` (a whole number, lower first under priority scheduling; default 0)
and `slo_class` (the name of the class the request's latencies are reported in).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.build import RequestLabels, build_trace, num_hash_blocks
from kvlab.traces.tabular import MAX_TOKENS, check_file
from kvlab.traces.types import Trace

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
HASH_BLOCK_SIZE = 512
_WHAT = f"a Mooncake trace (JSON lines with {', '.join(FIELDS)})"


def load_mooncake(path: str | Path, *, num_prompts: int | None = None) -> Trace:
    """Load a Mooncake JSONL trace: arrival = (timestamp - earliest timestamp) / 1000 seconds."""
    path = Path(path)
    check_file(path, _WHAT)
    timestamps: list[float] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    hash_ids: list[tuple[int, ...]] = []
    labels = RequestLabels([], [])
    labelled = False
    line_no = 0
    try:
        with path.open(encoding="utf-8") as file:
            for line_no, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                row = _parse_row(path, line_no, line)
                timestamps.append(row[0])
                input_lens.append(row[1])
                output_lens.append(row[2])
                hash_ids.append(row[3])
                labels.priorities.append(row[4])
                labels.slo_classes.append(row[5])
                labelled = labelled or row[6]
    except UnicodeDecodeError:
        raise KvlabError(f"{path} line {line_no + 1}: not UTF-8 text; expected {_WHAT}") from None
    if not timestamps:
        raise KvlabError(f"{path}: no requests; expected {_WHAT}")
    arrival_ms = np.asarray(timestamps, dtype=float)
    return build_trace(
        path,
        "mooncake",
        (arrival_ms - arrival_ms.min()) / 1000.0,
        np.asarray(input_lens, dtype=np.int64),
        np.asarray(output_lens, dtype=np.int64),
        num_prompts=num_prompts,
        hash_ids=hash_ids,
        hash_block_size=HASH_BLOCK_SIZE,
        labels=labels if labelled else None,
    )


def _parse_row(path: Path, line_no: int, line: str
               ) -> tuple[float, int, int, tuple[int, ...], int, str | None, bool]:
    """(timestamp ms, input length, output length, hash ids, priority, SLO class, whether
    either was given) of one line, or a KvlabError."""
    where = f"{path} line {line_no}"
    try:
        row = json.loads(line.rstrip())  # so an error column points into the line
    except json.JSONDecodeError as err:
        raise KvlabError(f"{where}, column {err.colno}: not valid JSON ({err.msg})") from None
    if not isinstance(row, dict):
        raise KvlabError(f"{where}: {_short(row)} is not a JSON object; expected {_WHAT}")
    missing = [name for name in FIELDS if name not in row]
    if missing:
        raise KvlabError(f"{where}: missing field {missing[0]}; expected {_WHAT}")
    timestamp = row["timestamp"]
    if not _is_number(timestamp) or not np.isfinite(timestamp):
        raise KvlabError(f"{where}, field timestamp: {_short(timestamp)} is not a number of "
                         "milliseconds")
    input_len = _length(where, "input_length", row["input_length"])
    output_len = _length(where, "output_length", row["output_length"])
    ids = row["hash_ids"]
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise KvlabError(f"{where}, field hash_ids: {_short(ids)} is not a list of whole numbers")
    if len(set(ids)) != len(ids):
        raise KvlabError(
            f"{where}, field hash_ids: an id repeats; each names a distinct prefix (the block and "
            "everything before it)"
        )
    expected = num_hash_blocks(input_len, HASH_BLOCK_SIZE)
    if len(ids) != expected:
        raise KvlabError(
            f"{where}, field hash_ids: {len(ids)} ids for input_length {input_len}; expected "
            f"ceil({input_len}/{HASH_BLOCK_SIZE}) = {expected}"
        )
    priority, slo_class = row.get("priority", 0), row.get("slo_class")
    if type(priority) is not int:
        raise KvlabError(f"{where}, field priority: {_short(priority)} is not a whole number")
    if slo_class is not None and (not isinstance(slo_class, str) or not slo_class.strip()):
        raise KvlabError(f"{where}, field slo_class: {_short(slo_class)} is not a class name")
    labelled = "priority" in row or slo_class is not None
    return (float(timestamp), input_len, output_len, tuple(ids), priority,
            None if slo_class is None else slo_class.strip(), labelled)


def _length(where: str, name: str, value: Any) -> int:
    """A token count >= 1 (a float with no fraction is accepted)."""
    if not _is_number(value) or not float(value).is_integer():
        raise KvlabError(f"{where}, field {name}: {_short(value)} is not a whole number")
    if value < 1:
        raise KvlabError(f"{where}, field {name}: {_short(value)} is too small: expected a "
                         "whole number >= 1")
    if value > MAX_TOKENS:
        raise KvlabError(f"{where}, field {name}: {_short(value)} is too large: expected a "
                         f"whole number <= {MAX_TOKENS:,}")
    return int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any) -> str:
    """The value as the user wrote it in JSON, cut short if long."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
