"""Reading the result files kvlab writes, for plotting: a run's summary JSON with its request
and step tables (`--save-result`), a sweep's Parquet dataset (`kvlab sweep -o DIR`) and a
validation report (`kvlab validate --save-result`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.errors import KvlabError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(slots=True)
class RunData:
    """One run: its summary (the saved JSON), and its per-request and per-step tables when
    they were saved beside it (None when not)."""

    label: str
    summary: dict[str, Any]
    requests: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    stem: str = "run"  # what its figure files are named after (the result file's name)


@dataclass(slots=True)
class SweepData:
    """A sweep's rows: one per run, `param.<key>` columns for the settings swept."""

    label: str
    rows: pd.DataFrame


@dataclass(slots=True)
class ValidationData:
    """A validation report: per-metric simulator and reference values and relative errors."""

    label: str
    document: dict[str, Any]


Result = RunData | SweepData | ValidationData


def load_results(paths: list[str | Path]) -> list[Result]:
    """Every result in `paths`, in order. Raises KvlabError naming a file that is missing or
    is not one of kvlab's result files."""
    results: list[Result] = []
    for path in map(Path, paths):
        if not path.exists():
            raise KvlabError(f"{path}: no such file or folder")
        if path.is_dir() or path.suffix == ".parquet":
            results.append(_load_sweep(path))
        elif path.suffix in (".csv", ".tsv"):
            raise KvlabError(f"{path}: a table, not a result; give the summary JSON saved "
                             "beside it (its tables are read with it)")
        else:
            results.extend(_load_json(path))
    return results


def _stem(path: Path) -> str:
    return path.name[: -len(".json")] if path.name.endswith(".json") else path.stem


def _load_sweep(path: Path) -> SweepData:
    import pandas as pd

    if path.is_dir() and not any(path.rglob("*.parquet")):
        raise KvlabError(f"{path}: a folder with no Parquet files (not a sweep's output)")
    try:
        rows = pd.read_parquet(path)
    except (OSError, ValueError, ImportError) as exc:
        raise KvlabError(f"{path}: cannot read it as a sweep's Parquet rows: {exc}") from exc
    if not any(str(column).startswith("param.") for column in rows.columns):
        raise KvlabError(f"{path}: no param.* columns (not a sweep's output)")
    return SweepData(label=path.stem, rows=rows)


def _documents(path: Path) -> list[dict[str, Any]]:
    """The JSON documents of a file: one, or one a line (vLLM's --append-result)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"{path}: cannot read it: {exc}") from exc
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    documents = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            documents.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise KvlabError(f"{path}: line {number}: not JSON ({exc.msg})") from exc
    return documents


def _load_json(path: Path) -> list[Result]:
    results: list[Result] = []
    documents = _documents(path)
    for index, document in enumerate(documents):
        label = _stem(path) + (f"#{index + 1}" if len(documents) > 1 else "")
        if not isinstance(document, dict):
            raise KvlabError(f"{path}: not a kvlab result (a JSON {type(document).__name__})")
        if "metrics" in document and "sim" in document:
            results.append(ValidationData(label=label, document=document))
        elif "completed" in document and "duration" in document:
            tables = _tables(path) if len(documents) == 1 else {}
            results.append(RunData(label=_run_label(document, label), summary=document,
                                   requests=tables.get("requests"), steps=tables.get("steps"),
                                   stem=label))
        else:
            raise KvlabError(f"{path}: not a kvlab result: neither a run's summary (no "
                             "'completed') nor a validation report (no 'metrics')")
    return results


def _run_label(summary: dict[str, Any], fallback: str) -> str:
    return str(summary.get("label") or summary.get("policy") or fallback)


def _tables(path: Path) -> dict[str, pd.DataFrame]:
    """The `<stem>.requests.*` and `<stem>.steps.*` tables saved beside a summary JSON."""
    import pandas as pd

    tables = {}
    for key in ("requests", "steps"):
        for suffix in ("csv", "parquet"):
            table_path = path.with_name(f"{_stem(path)}.{key}.{suffix}")
            if not table_path.exists():
                continue
            try:
                tables[key] = (pd.read_csv(table_path) if suffix == "csv"
                               else pd.read_parquet(table_path))
            except (OSError, ValueError, ImportError) as exc:
                raise KvlabError(f"{table_path}: cannot read the table: {exc}") from exc
            break
    return tables
