"""Vectorised CSV reading for trace files, with user errors that name the file, line and column.

A plain file (no quotes, no blank lines, every row as many fields as the header) whose columns
hold plain values (digits; date-times like Azure's) is read without pandas, which costs a
quarter of a second to import; anything else is read and parsed with pandas and numpy over
whole arrays, as before, and gives the same values and the same errors. Only when a value is
bad is the file scanned row by row, to turn the first bad row's position into the line an
editor shows.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.build import RequestLabels

if TYPE_CHECKING:  # imported where a file is not plain (`Table.frame`)
    import pandas as pd

_EXAMPLE_TIMESTAMP = "2023-11-16 18:15:46.6805900"
# Date-times numpy reads as pandas' ISO 8601 parser does (naive: UTC); others go to pandas.
_PLAIN_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?")
_PLAIN_DIGITS = 15  # digit strings this long at most are exact as float64 and int64


def check_file(path: Path, what: str) -> None:
    """Raise a KvlabError unless `path` is a readable file; `what` says what it should hold."""
    if not path.exists():
        raise KvlabError(f"{path}: no such file; expected {what}")
    if not path.is_file():
        raise KvlabError(f"{path}: not a file; expected {what}")


@dataclass(slots=True)
class Table:
    """The non-blank data rows of a CSV file as strings, with their 0-based row positions.

    `row_index[i]` is the position of row i among all data rows (blank ones included) in file
    order, which `line_of_row` turns into a line number. A plain file's rows are in `plain`
    (column -> its strings); `frame` reads the file with pandas when first asked for.
    """

    path: Path
    header: list[str]
    row_index: np.ndarray
    sep: str = ","  # the field separator
    plain: dict[str, list[str]] | None = None
    _frame: pd.DataFrame | None = field(default=None, repr=False)
    _what: str = ""

    @property
    def frame(self) -> pd.DataFrame:
        """The rows as pandas reads them (strings), blank rows left out."""
        if self._frame is None:
            self._frame = _read_frame(self.path, self.header, self._what, self.sep)[0]
        return self._frame

    def __len__(self) -> int:
        return len(self.row_index)

    def value(self, column: str, row: int) -> str:
        """The text of `column` in data row `row` (0-based, blank rows left out)."""
        if self.plain is not None:
            return self.plain[column][row]
        return str(self.frame[column].iloc[row])


def read_table(path: Path, required: Sequence[str], what: str, *, sep: str = ",") -> Table:
    """Read a CSV (fields separated by `sep`) with a header holding every `required` column;
    blank lines are skipped."""
    check_file(path, what)
    plain = _read_plain(path, sep)
    if plain is not None:
        header, columns = plain
        _check_columns(path, header, required, what)
        num_rows = len(next(iter(columns.values())))
        return Table(path, header, np.arange(num_rows), sep, plain=columns, _what=what)
    frame, keep = _read_frame(path, required, what, sep)
    return Table(path, [str(c) for c in frame.columns], keep, sep, _frame=frame, _what=what)


def _read_plain(path: Path, sep: str) -> tuple[list[str], dict[str, list[str]]] | None:
    """(header, column -> strings) of a plain file: UTF-8 without quotes, blank lines or a
    byte-order mark, at least one row, every row as many fields as a header of distinct,
    named columns; None for any other file (read by pandas)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    if '"' in text or text.startswith("\ufeff"):
        return None
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        if "\r" in text:  # (a lone carriage return)
            return None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) < 2 or any(not line.strip() for line in lines):
        return None
    header = [name.strip() for name in lines[0].split(sep)]
    if len(set(header)) != len(header) or not all(header):
        return None
    rows = [line.split(sep) for line in lines[1:]]
    if any(len(row) != len(header) for row in rows):
        return None
    return header, dict(zip(header, map(list, zip(*rows, strict=True)), strict=True))


def _check_columns(path: Path, header: list[str], required: Sequence[str], what: str) -> None:
    missing = [c for c in required if c not in header]
    if missing:
        raise KvlabError(
            f"{path} line 1: missing column {missing[0]}; expected {what} with columns "
            f"{', '.join(required)}, found {', '.join(header)}"
        )


def _read_frame(path: Path, required: Sequence[str], what: str, sep: str
                ) -> tuple[pd.DataFrame, np.ndarray]:
    """The file read by pandas: its non-blank rows (strings) and their positions."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False,
                            skipinitialspace=True, sep=sep)
    except pd.errors.EmptyDataError:
        raise KvlabError(f"{path}: the file is empty; expected {what}") from None
    except pd.errors.ParserError as err:
        raise _field_count_error(path, err) from None
    except UnicodeDecodeError as err:
        raise KvlabError(f"{path}: not a UTF-8 text file ({err.reason}); expected {what}") from None
    header = [str(c).strip() for c in frame.columns]
    frame.columns = header
    _check_columns(path, header, required, what)
    blank = np.ones(len(frame), dtype=bool)
    for column in header:
        blank &= (frame[column].str.strip() == "").to_numpy()
    keep = ~blank
    if not keep.any():
        raise KvlabError(f"{path}: no requests, only a header; expected {what}")
    return frame[keep].reset_index(drop=True), np.flatnonzero(keep)


@dataclass(slots=True)
class Parsed:
    """One parsed column: its values and, per kind of problem, which rows have it.

    Each problem is (mask of rows, text completing "'<value>' ..."), e.g. "is not a whole number".
    """

    values: np.ndarray
    problems: list[tuple[np.ndarray, str]]

    def bad(self) -> np.ndarray:
        """Rows with any problem."""
        bad = np.zeros(len(self.values), dtype=bool)
        for mask, _ in self.problems:
            bad |= mask
        return bad

    def problem_at(self, row: int) -> str:
        """What is wrong with the value in `row`."""
        return next(text for mask, text in self.problems if mask[row])


# A token count beyond this is a corrupt row, not a request (and would overflow int64 math).
MAX_TOKENS = 2**31 - 1


def whole_numbers(table: Table, column: str, *, min_value: int = 1,
                  max_value: int = MAX_TOKENS) -> Parsed:
    """Parse a column of whole numbers in [min_value, max_value] (a trailing '.0' is
    accepted)."""
    numbers = _plain_numbers(table, column)
    if numbers is None:
        import pandas as pd

        numbers = pd.to_numeric(table.frame[column], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        not_whole = ~np.isfinite(numbers) | (numbers != np.floor(numbers))
        too_small = ~not_whole & (numbers < min_value)
        too_large = ~not_whole & (numbers > max_value)
    values = np.where(not_whole | too_large, 0, numbers).astype(np.int64)
    return Parsed(values, [
        (not_whole, "is not a whole number"),
        (too_small, f"is too small: expected a whole number >= {min_value}"),
        (too_large, f"is too large: expected a whole number <= {max_value:,}"),
    ])


def read_labels(table: Table, columns: dict[str, Parsed]) -> RequestLabels | None:
    """The optional `priority` (whole numbers, any sign) and `slo_class` (names) columns as
    each row's labels, None when the table has neither; a bad priority joins `columns`, so
    `raise_first_bad` reports it at its line."""
    has_priority, has_class = "priority" in table.header, "slo_class" in table.header
    if not (has_priority or has_class):
        return None
    num = len(table)
    priorities = [0] * num
    if has_priority:
        columns["priority"] = whole_numbers(table, "priority", min_value=-MAX_TOKENS)
        priorities = columns["priority"].values.tolist()
    classes: list[str | None] = [None] * num
    if has_class:
        names = table.plain["slo_class"] if table.plain is not None \
            else table.frame["slo_class"].tolist()
        classes = [name.strip() or None for name in names]
    return RequestLabels(priorities, classes)


def seconds(table: Table, column: str) -> Parsed:
    """Parse a column of finite numbers (seconds)."""
    numbers = _plain_numbers(table, column)
    if numbers is None:
        import pandas as pd

        numbers = pd.to_numeric(table.frame[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(numbers)
    return Parsed(np.where(bad, 0.0, numbers), [(bad, "is not a number of seconds")])


def timestamps_ns(table: Table, column: str) -> Parsed:
    """Parse a column of ISO-8601 date-times (e.g. Azure's) into int64 nanoseconds."""
    plain = _plain_timestamps_ns(table, column)
    if plain is not None:
        return Parsed(plain, [(np.zeros(len(plain), dtype=bool),
                               f"is not a timestamp like {_EXAMPLE_TIMESTAMP}")])
    import pandas as pd

    parsed = pd.to_datetime(table.frame[column], format="ISO8601", errors="coerce", utc=True)
    bad = parsed.isna().to_numpy()
    values = np.where(bad, 0, parsed.to_numpy(dtype="datetime64[ns]").view(np.int64))
    return Parsed(values, [(bad, f"is not a timestamp like {_EXAMPLE_TIMESTAMP}")])


def _plain_numbers(table: Table, column: str) -> np.ndarray | None:
    """A plain table's column of digit strings as float64 (exact: 15 digits at most); None
    where any value is something else (pandas parses those)."""
    if table.plain is None:
        return None
    values = table.plain[column]
    if not all(value.isascii() and value.isdigit() and len(value) <= _PLAIN_DIGITS
               for value in values):
        return None
    return np.array(list(map(int, values)), dtype=np.float64)


def _plain_timestamps_ns(table: Table, column: str) -> np.ndarray | None:
    """A plain table's column of date-times like Azure's, as int64 nanoseconds since the
    epoch (UTC); None where any value has another form, or is no date (pandas parses those)."""
    if table.plain is None:
        return None
    values = table.plain[column]
    match = _PLAIN_TIMESTAMP.fullmatch
    if not all(match(value) for value in values):
        return None
    try:
        return np.array(values, dtype="datetime64[ns]").view(np.int64)
    except ValueError:  # (a day or an hour out of range)
        return None


def raise_first_bad(table: Table, columns: dict[str, Parsed]) -> None:
    """Raise a KvlabError for the earliest bad row of any parsed column; return if none is bad."""
    bad_rows = np.zeros(len(table), dtype=bool)
    bad_by_column = {name: parsed.bad() for name, parsed in columns.items()}
    for bad in bad_by_column.values():
        bad_rows |= bad
    if not bad_rows.any():
        return
    row = int(bad_rows.argmax())
    line, fields = line_of_row(table.path, int(table.row_index[row]), table.sep)
    if len(fields) != len(table.header):
        raise KvlabError(
            f"{table.path} line {line}: {len(fields)} fields, expected {len(table.header)} "
            f"({','.join(table.header)})"
        )
    name = next(name for name, bad in bad_by_column.items() if bad[row])
    value = table.value(name, row)
    problem = columns[name].problem_at(row)
    raise KvlabError(f"{table.path} line {line}, column {name}: {value!r} {problem}")


def line_of_row(path: Path, row: int, sep: str = ",") -> tuple[int, list[str]]:
    """The 1-based line where data row `row` (0-based, blank rows counted) starts, and its fields
    (separated by `sep`).

    A row-by-row scan, used only to word an error message.
    """
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.reader(file, skipinitialspace=True, delimiter=sep)
        next(reader)
        start = reader.line_num + 1
        for position, fields in enumerate(reader):
            if position == row:
                return start, fields
            start = reader.line_num + 1
    raise AssertionError(f"{path} has no data row {row}")


def _field_count_error(path: Path, err: Exception) -> KvlabError:
    """The error for a row with more fields than the header, found by a row-by-row scan."""
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.reader(file, skipinitialspace=True)
        header = next(reader)
        start = reader.line_num + 1
        for fields in reader:
            if len(fields) > len(header):
                return KvlabError(
                    f"{path} line {start}: {len(fields)} fields, expected {len(header)} "
                    f"({','.join(h.strip() for h in header)})"
                )
            start = reader.line_num + 1
    return KvlabError(f"{path}: cannot be read as CSV ({err})")
