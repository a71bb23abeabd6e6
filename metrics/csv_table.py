"""A table written as CSV straight from its columns: the bytes pandas' `to_csv(index=False)`
writes for the same columns, without building a DataFrame (a simulation's step table is
~100k rows of 26 columns; pandas took most of a second to write it).

Every row is one `%` of a row format, in C: '%d' for integers, '%r' for floats (their
shortest round-trip form: numpy's and Python's are the same digits), text cells made once per
distinct value, and a column that holds one value throughout written into the format itself.
Cells read as pandas writes them: NaN and None empty, text quoted by the csv module's rules
(tests/metrics/test_csv_table.py compares the bytes with pandas').
"""

from __future__ import annotations

import csv
import io
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _quoted(text: str) -> str:
    """A cell as pandas' csv writer writes it (minimal quoting, quotes doubled): the csv
    module's own rules, which differ between Python versions (a carriage return is quoted
    from 3.12 on)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow([text, ""])
    return buffer.getvalue()[:-2]  # (less ",\n")


def _float_cells(values: list[float]) -> list[str]:
    cells = list(map(repr, values))
    if "nan" in cells:  # NaN is an empty cell; repr(nan) is 'nan' (a negative NaN too)
        cells = ["" if math.isnan(value) else cell for value, cell in zip(values, cells,
                                                                           strict=True)]
    return cells


def _text_cells(values: Iterable[Any]) -> list[str]:
    """Cells of text (None and NaN empty): each distinct value quoted once."""
    cells: dict[Any, str] = {}
    out = []
    for value in values:
        try:
            out.append(cells[value])
        except KeyError:
            cell = "" if value is None or (isinstance(value, float) and math.isnan(value)) \
                else _quoted(str(value))
            cells[value] = cell
            out.append(cell)
    return out


def _plain(values: Any) -> tuple[str, Sequence[Any], bool]:
    """A column as its row format ('%d' whole numbers, '%r' floats without NaN, '%s' cells
    made here), its values as Python objects, and whether it holds one value throughout."""
    if isinstance(values, array):
        values = np.frombuffer(values, dtype=np.float64 if values.typecode == "d" else np.int64) \
            if values.typecode in "dq" else np.asarray(values)
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        if values.dtype.kind == "f":
            if np.isnan(values).any():
                cells = _float_cells(values.astype(np.float64).tolist())
                return "%s", cells, _one_cell(cells)
            form, values = "%r", values.astype(np.float64, copy=False)
        else:
            form, values = "%d", values.astype(np.int64, copy=False)
        if values.size and (values == values[0]).all():
            return form, [values[0].item()] * values.size, True  # (no list of every value)
        return form, values.tolist(), False
    if isinstance(values, np.ndarray):
        values = [str(value) for value in values.tolist()] if values.dtype.kind == "b" \
            else values.tolist()
    values = list(values)
    if values and all(type(value) is int for value in values):
        return "%d", values, min(values) == max(values)
    if values and all(type(value) is float and value == value for value in values):
        return "%r", values, min(values) == max(values)
    cells = _text_cells(values)
    return "%s", cells, _one_cell(cells)


def _one_cell(cells: list[str]) -> bool:
    """Whether a (non-empty) column of cells holds one cell throughout."""
    return bool(cells) and all(cell == cells[0] for cell in cells)


def write_csv(path: str | Path, columns: Mapping[str, Any]) -> None:
    """Write `columns` (name -> values, all of one length) to `path` as CSV with a header row,
    as `pandas.DataFrame(columns).to_csv(path, index=False)` would.

    Every row is one `%` of a row format: a column of one value is written into the format
    itself (counts that never moved, in most runs a third of the step table's columns)."""
    formats: list[str] = []
    varying: list[Sequence[Any]] = []
    lengths = set()
    for values in columns.values():
        form, plain, one = _plain(values)
        lengths.add(len(plain))
        if one:
            formats.append((form % plain[0]).replace("%", "%%"))
        else:
            formats.append(form)
            varying.append(plain)
    assert len(lengths) <= 1, f"columns of different lengths: {sorted(lengths)}"
    num_rows = lengths.pop() if lengths else 0
    if len(formats) == 1 and formats[0] in ("", "%s"):  # (csv quotes a lone empty field)
        formats = ['%s' if formats[0] == "%s" else '""']
        if varying:
            varying = [['""' if cell == "" else cell for cell in varying[0]]]
    row_format = ",".join(formats) + "\n"
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(",".join(_quoted(str(name)) for name in columns) + "\n")
        if varying:
            out.write("".join([row_format % row for row in zip(*varying, strict=True)]))
        else:
            out.write(row_format.replace("%%", "%") * num_rows)
