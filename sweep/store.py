"""A sweep's rows on disk: a Parquet dataset (a folder of part files) that
`pandas.read_parquet(folder)` reads whole.

Rows are appended as new part files, each written to a hidden temporary name and renamed into
place, so that a reader (or an interrupted sweep) only ever sees whole parts. Every part has the
same schema: when a part brings a column the others lack, or a wider type (an integer column
that meets a float, a column of nulls that meets values), the older parts are rewritten to the
common schema first. One sweep writes to a folder at a time.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.errors import KvlabError
from kvlab.sweep.runner import ERROR_COLUMN, KEY_COLUMN, STATUS_COLUMN

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

PART_GLOB = "part-*.parquet"
TEXT_COLUMNS = (KEY_COLUMN, STATUS_COLUMN, ERROR_COLUMN)


def require_pyarrow() -> None:
    """A KvlabError saying how to install pyarrow when it is missing (sweeps write Parquet)."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise KvlabError("sweeps write Parquet, which needs pyarrow: "
                         "pip install 'kvlab[sweep]' (or pip install pyarrow)")


class SweepStore:
    """The Parquet dataset of one sweep's rows, one row per run, keyed by `run_key`."""

    def __init__(self, path: str | Path) -> None:
        require_pyarrow()
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise KvlabError(f"{self.path} is a file; a sweep's output is a folder of Parquet "
                             "parts")
        self._schema: pa.Schema | None = None

    def parts(self) -> list[Path]:
        """The part files, oldest first."""
        return sorted(self.path.glob(PART_GLOB)) if self.path.is_dir() else []

    def statuses(self) -> dict[str, str]:
        """{run key: status} of every stored row."""
        import pyarrow.parquet as pq

        found: dict[str, str] = {}
        for part in self.parts():
            table = pq.read_table(part, columns=[KEY_COLUMN, STATUS_COLUMN])
            found.update(zip(table[KEY_COLUMN].to_pylist(), table[STATUS_COLUMN].to_pylist(),
                             strict=True))
        return found

    def read(self) -> pd.DataFrame:
        """Every stored row (an empty frame when there are none)."""
        import pandas as pd

        if not self.parts():
            return pd.DataFrame()
        return pd.read_parquet(self.path)

    def append(self, rows: Sequence[Mapping[str, Any]]) -> Path | None:
        """Write `rows` as one new part (None when there are none), widening the stored
        parts' schema first when the rows need it."""
        if not rows:
            return None
        table = rows_table(rows)
        stored = self._stored_schema()
        if stored is None:
            schema = table.schema
        else:
            schema = unify_schemas([stored, table.schema])
            if not schema.equals(stored):
                for part in self.parts():
                    self._rewrite(part, lambda t: t, schema)
        self.path.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        path = self.path / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
        _write_atomic(conform(table, schema), path)
        self._schema = schema
        return path

    def drop(self, keys: Iterable[str]) -> int:
        """Remove the rows of these run keys (a forced re-run replaces them); how many."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        wanted = set(keys)
        if not wanted:
            return 0
        removed = 0
        for part in self.parts():
            run_keys = pq.read_table(part, columns=[KEY_COLUMN])[KEY_COLUMN]
            hit = pc.is_in(run_keys, value_set=_string_array(wanted))
            count = int(pc.sum(hit).as_py() or 0)
            if not count:
                continue
            removed += count
            if count == len(run_keys):
                part.unlink()
            else:
                self._rewrite(part, lambda t: t.filter(pc.invert(
                    pc.is_in(t[KEY_COLUMN], value_set=_string_array(wanted)))), None)
        return removed

    def _stored_schema(self) -> pa.Schema | None:
        import pyarrow.parquet as pq

        if self._schema is None:
            parts = self.parts()
            if parts:
                self._schema = unify_schemas([pq.read_schema(part) for part in parts])
        return self._schema

    def _rewrite(self, part: Path, change: Any, schema: pa.Schema | None) -> None:
        import pyarrow.parquet as pq

        table = change(pq.read_table(part))
        _write_atomic(table if schema is None else conform(table, schema), part)


def _string_array(values: Iterable[str]) -> Any:
    import pyarrow as pa

    return pa.array(sorted(values), type=pa.string())


def _write_atomic(table: pa.Table, path: Path) -> None:
    import pyarrow.parquet as pq

    temporary = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, temporary)
    os.replace(temporary, path)


def rows_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows as an Arrow table: columns in first-seen order, missing values null, each column
    typed from its values (text when they mix text and numbers)."""
    import pyarrow as pa

    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    arrays = {}
    for name in names:
        values = [row.get(name) for row in rows]
        try:  # the text columns of every row are text even when all null (no schema changes)
            arrays[name] = pa.array(values, type=pa.string() if name in TEXT_COLUMNS else None)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arrays[name] = pa.array([None if v is None else str(v) for v in values],
                                    type=pa.string())
    return pa.table(arrays)


def _common_type(types: list[pa.DataType]) -> pa.DataType:
    """The narrowest type holding every one of `types`: itself when they agree, a float for
    mixed numbers, text otherwise; nulls take the others' type."""
    import pyarrow as pa

    known = [t for t in types if not pa.types.is_null(t)]
    if not known:
        return pa.null()
    if all(t.equals(known[0]) for t in known):
        return known[0]
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
           for t in known):
        if all(pa.types.is_integer(t) for t in known):
            return pa.int64()
        return pa.float64()
    return pa.string()


def unify_schemas(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """One schema with every column of `schemas` (in first-seen order), each of the common
    type of its occurrences."""
    import pyarrow as pa

    order: dict[str, list[pa.DataType]] = {}
    for schema in schemas:
        for field in schema:
            order.setdefault(field.name, []).append(field.type)
    return pa.schema([pa.field(name, _common_type(types)) for name, types in order.items()])


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with the columns of `schema`, in its order and types (missing ones null)."""
    import pyarrow as pa

    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(len(table), type=field.type))
            continue
        column = table[field.name]
        if not column.type.equals(field.type):
            if pa.types.is_string(field.type) and not pa.types.is_string(column.type):
                column = pa.array([None if v is None else str(v) for v in column.to_pylist()],
                                  type=pa.string())
            else:
                column = column.cast(field.type)
        columns.append(column)
    return pa.table(columns, schema=schema)
