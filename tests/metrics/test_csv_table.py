"""`write_csv` writes the bytes pandas' `to_csv(index=False)` writes for the same columns."""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from kvlab.metrics.csv_table import write_csv

_INTS = st.lists(st.integers(-(2**62), 2**62), min_size=0, max_size=30)
_FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)
_TEXT = st.one_of(st.none(), st.text(alphabet='ab ,"\n\r;x%', max_size=6))


def _pandas_bytes(columns: dict, tmp_path) -> bytes:
    frame = pd.DataFrame({name: pd.Series(values, dtype=object) if isinstance(values, list)
                          else np.asarray(values) for name, values in columns.items()})
    path = tmp_path / "pandas.csv"
    frame.to_csv(path, index=False)
    return path.read_bytes()


def _ours(columns: dict, tmp_path) -> bytes:
    path = tmp_path / "ours.csv"
    write_csv(path, columns)
    return path.read_bytes()


@given(data=st.data(), num_rows=st.integers(0, 12))
def test_random_columns_are_written_as_pandas_writes_them(tmp_path_factory, data, num_rows):
    tmp_path = tmp_path_factory.mktemp("csv")
    rows = st.lists(_FLOATS, min_size=num_rows, max_size=num_rows)
    columns = {
        "ints": np.array(data.draw(st.lists(st.integers(-(2**62), 2**62), min_size=num_rows,
                                            max_size=num_rows)), dtype=np.int64),
        "floats": np.array(data.draw(rows), dtype=np.float64),
        "recorded": array("d", data.draw(rows)),
        "counts": array("q", [data.draw(st.sampled_from([0, 7]))] * num_rows),
        "text, quoted": data.draw(st.lists(_TEXT, min_size=num_rows, max_size=num_rows)),
        "flags": np.array(data.draw(st.lists(st.booleans(), min_size=num_rows,
                                             max_size=num_rows)), dtype=bool),
    }
    assert _ours(columns, tmp_path) == _pandas_bytes(columns, tmp_path)


@given(values=st.lists(_TEXT, min_size=1, max_size=8))
def test_a_single_text_column_is_written_as_pandas_writes_it(tmp_path_factory, values):
    tmp_path = tmp_path_factory.mktemp("csv")
    columns = {"only": values}
    assert _ours(columns, tmp_path) == _pandas_bytes(columns, tmp_path)


def test_constant_and_empty_columns(tmp_path):
    columns = {"zero": array("q", [0] * 5), "half": np.full(5, 0.5), "pct%": ["%d"] * 5}
    assert _ours(columns, tmp_path) == _pandas_bytes(columns, tmp_path)
    empty = {"a": array("q"), "b": np.array([], dtype=np.float64)}
    assert _ours(empty, tmp_path) == _pandas_bytes(empty, tmp_path) == b"a,b\n"
