"""Result files of a run: the summary JSON (vLLM's `--save-result` naming) and the two tables."""

from __future__ import annotations

import importlib.util
import json
import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvlab.errors import KvlabError, writing
from kvlab.metrics.csv_table import write_csv
from kvlab.metrics.records import StepRecorder
from kvlab.metrics.run_result import RunResult
from kvlab.metrics.tables import frame_of, request_columns

if TYPE_CHECKING:
    import pandas as pd

TABLE_FORMATS = ("csv", "parquet")


def _sanitize(text: str) -> str:
    """A file-name-safe form of text: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "unknown"


def _rate_text(rate: object) -> str:
    """A request rate as vLLM writes it in file names: 4 -> "4.0", inf -> "inf"."""
    try:
        return str(float(rate))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(rate)


# Trace formats with timestamps of their own, replayed when no request rate resamples them.
REPLAYED_DATASETS = ("azure", "mooncake", "burstgpt")


def default_result_filename(summary: dict, *, now: datetime | None = None) -> str:
    """vLLM's result file name, sanitised:
    `<label>-<rate>qps[-concurrency<N>]-<model>-<YYYYMMDD-HHMMSS>.json`.

    The label is the summary's `label`, else its backend; the concurrency part is there when
    the summary has a `max_concurrency`; the model is its last path component (as vLLM's base
    model id); an unknown request rate is written as "inf", vLLM's default, but a trace file
    whose own timestamps were replayed (no rate given) is `replay` instead of `<rate>qps`.
    """
    label = str(summary.get("label") or summary.get("backend") or "kvlab")
    rate = summary.get("request_rate")
    rate_text = "inf" if rate is None else _rate_text(rate)
    replayed = rate_text == "inf" and summary.get("dataset_name") in REPLAYED_DATASETS
    concurrency = summary.get("max_concurrency")
    rate_part = ("replay" if replayed else f"{rate_text}qps") + (
        "" if concurrency is None else f"-concurrency{concurrency}")
    model = str(summary.get("model") or "model").rstrip("/").split("/")[-1]
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    parts = (_sanitize(label), _sanitize(rate_part), _sanitize(model), stamp)
    return "-".join(parts) + ".json"


def _json_default(value: object) -> object:
    """numpy scalars and arrays in metadata become plain Python values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _write_table(table: pd.DataFrame | dict[str, Any], path: Path, table_format: str) -> None:
    """A DataFrame, or columns by name (written as CSV without pandas)."""
    if isinstance(table, dict):
        if table_format == "csv":
            write_csv(path, table)
            return
        table = frame_of(table)
    if table_format == "csv":
        table.to_csv(path, index=False)
    else:
        table.to_parquet(path, engine="pyarrow", index=False)


def _check_table_format(table_format: str) -> None:
    if table_format not in TABLE_FORMATS:
        raise KvlabError(
            f"table format {table_format!r} is not supported; "
            f"choose from {', '.join(TABLE_FORMATS)}"
        )
    if table_format == "parquet" and importlib.util.find_spec("pyarrow") is None:
        raise KvlabError(
            "table format 'parquet' needs pyarrow, which is not installed: "
            "pip install pyarrow, or use table format 'csv'"
        )


def save_step_profile(steps: StepRecorder, path: Path) -> Path:
    """Write a run's per-step table to `path` (.parquet, else CSV): the profile `kvlab
    calibrate` fits, as the steps table of `save_results`."""
    table_format = "parquet" if path.suffix == ".parquet" else "csv"
    _check_table_format(table_format)
    with writing(path, "the step profile"):
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_table(steps.ordered_columns(), path, table_format)
    return path


def result_stem(path: Path) -> str:
    """A result file's name without `.json`: what the files saved beside it start with."""
    name = path.name
    return name[: -len(".json")] if name.endswith(".json") else name


def save_results(
    summary: dict,
    result: RunResult,
    *,
    result_dir: str | Path = ".",
    result_filename: str | None = None,
    table_format: str = "csv",
    tables: dict[str, pd.DataFrame] | None = None,
    append: bool = False,
) -> list[Path]:
    """Write the summary JSON and, beside it, a `<stem>.<name>.<fmt>` file per table: by
    default `requests` (per_request_table's columns) and `steps` (per_step_table's), written
    from the records' columns; `tables` (DataFrames) replaces them.

    The JSON is the summary plus a "date" (as vLLM's result files); `result_filename` defaults to
    `default_result_filename(summary)`. With `append` the JSON is added as one more line to an
    existing file (vLLM's --append-result: one JSON document per line). Creates `result_dir`.
    Returns the paths written. Raises KvlabError for an unknown table format, parquet without
    pyarrow, or a path that cannot be written.
    """
    _check_table_format(table_format)
    now = datetime.now()
    name = result_filename or default_result_filename(summary, now=now)
    json_path = Path(result_dir) / name
    stem = result_stem(json_path)
    written: dict[str, pd.DataFrame | dict[str, Any]] = dict(tables) if tables is not None else {
        "requests": request_columns(result), "steps": result.steps.ordered_columns()}
    table_paths = {key: json_path.with_name(f"{stem}.{key}.{table_format}") for key in written}
    payload = {"date": now.strftime("%Y%m%d-%H%M%S"), **summary}
    # allow_nan=False: a NaN or infinity in a summary is a bug, not something to save.
    try:
        text = json.dumps(payload, indent=None if append else 2, allow_nan=False,
                          default=_json_default)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        if append and json_path.exists() and json_path.stat().st_size:
            with json_path.open("a", encoding="utf-8") as out:
                out.write(text + "\n")
        else:
            json_path.write_text(text + "\n", encoding="utf-8")
        for key, table in written.items():
            _write_table(table, table_paths[key], table_format)
    except OSError as exc:
        raise KvlabError(
            f"cannot write results to {exc.filename or json_path.parent}: {exc.strerror or exc}"
        ) from exc
    return [json_path, *table_paths.values()]
