"""Result files of a run: the summary JSON (vLLM's `--save-result` naming) and the two tables."""

from __future__ import annotations

import importlib.util
import json
import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvlab.errors import KvlabError
from kvlab.metrics.records import StepRecorder
from kvlab.metrics.run import RunResult
from kvlab.metrics.summary import per_request_table, per_step_table, step_table

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


def default_result_filename(summary: dict, *, now: datetime | None = None) -> str:
    """vLLM's result file name: `<backend>-<rate>qps-<model>-<YYYYMMDD-HHMMSS>.json`, sanitised.

    The model is its last path component (as vLLM's base model id); an unknown request rate is
    written as "inf", vLLM's default.
    """
    backend = str(summary.get("backend") or "kvlab")
    rate = summary.get("request_rate")
    rate_text = "inf" if rate is None else _rate_text(rate)
    model = str(summary.get("model") or "model").rstrip("/").split("/")[-1]
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    parts = (_sanitize(backend), _sanitize(f"{rate_text}qps"), _sanitize(model), stamp)
    return "-".join(parts) + ".json"


def _json_default(value: object) -> object:
    """numpy scalars and arrays in metadata become plain Python values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _write_table(table: pd.DataFrame, path: Path, table_format: str) -> None:
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_table(step_table(steps), path, table_format)
    except OSError as exc:
        raise KvlabError(f"cannot write the step profile {path}: {exc.strerror or exc}") from exc
    return path


def save_results(
    summary: dict,
    result: RunResult,
    *,
    result_dir: str | Path = ".",
    result_filename: str | None = None,
    table_format: str = "csv",
) -> list[Path]:
    """Write the summary JSON and, beside it, `<stem>.requests.<fmt>` and `<stem>.steps.<fmt>`.

    The JSON is the summary plus a "date" (as vLLM's result files); `result_filename` defaults to
    `default_result_filename(summary)`. Creates `result_dir`. Returns the three paths written.
    Raises KvlabError for an unknown table format, parquet without pyarrow, or a path that
    cannot be written.
    """
    _check_table_format(table_format)
    now = datetime.now()
    name = result_filename or default_result_filename(summary, now=now)
    json_path = Path(result_dir) / name
    stem = json_path.name[: -len(".json")] if json_path.name.endswith(".json") else json_path.name
    requests_path = json_path.with_name(f"{stem}.requests.{table_format}")
    steps_path = json_path.with_name(f"{stem}.steps.{table_format}")
    payload = {"date": now.strftime("%Y%m%d-%H%M%S"), **summary}
    # allow_nan=False: a NaN or infinity in a summary is a bug, not something to save.
    text = json.dumps(payload, indent=2, allow_nan=False, default=_json_default)
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n", encoding="utf-8")
        _write_table(per_request_table(result), requests_path, table_format)
        _write_table(per_step_table(result), steps_path, table_format)
    except OSError as exc:
        raise KvlabError(
            f"cannot write results to {exc.filename or json_path.parent}: {exc.strerror or exc}"
        ) from exc
    return [json_path, requests_path, steps_path]
