"""A plain trace CSV is read without pandas, to the same trace pandas reads from the same rows
written in a form only pandas reads (quoted fields, blank lines)."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.traces import bundled_trace_path, load_azure, load_burstgpt
from kvlab.traces.tabular import read_table

_STAMP = st.builds(
    "2023-11-{:02d} {:02d}:{:02d}:{:02d}{}".format,
    st.integers(1, 30), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59),
    st.sampled_from(["", ".5", ".6805900", ".123456789", ".0"]))
_ROW = st.tuples(_STAMP, st.integers(1, 10**6), st.integers(1, 5000))


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@given(rows=st.lists(_ROW, min_size=1, max_size=20))
def test_plain_and_pandas_read_the_same_azure_trace(tmp_path_factory, rows):
    folder = tmp_path_factory.mktemp("azure")
    header = "TIMESTAMP,ContextTokens,GeneratedTokens"
    plain = _write(folder / "plain.csv", [header, *(f"{t},{i},{o}" for t, i, o in rows)])
    # quotes and a blank line: only pandas reads this one
    quoted = _write(folder / "quoted.csv",
                    [header, "", *(f'"{t}",{i},"{o}"' for t, i, o in rows)])
    assert read_table(plain, (), "").plain is not None
    assert read_table(quoted, (), "").plain is None
    assert load_azure(plain).requests == load_azure(quoted).requests


def test_burstgpt_digits_read_plain_as_pandas_reads_them(tmp_path):
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
    rows = ["5,ChatGPT,472,18,490,Conversation log", "3,GPT-4,1087,40,1127,API log",
            "9,ChatGPT,30,2,32,Conversation log"]
    plain = _write(tmp_path / "plain.csv", [header, *rows])
    spaced = _write(tmp_path / "spaced.csv", [header, *(row.replace(",", ", ") for row in rows)])
    assert read_table(plain, (), "").plain is not None
    assert load_burstgpt(plain).requests == load_burstgpt(spaced).requests


def test_a_bad_value_names_its_line_either_way(tmp_path):
    header = "TIMESTAMP,ContextTokens,GeneratedTokens"
    rows = ["2023-11-16 18:00:01.0,2,2", "2023-11-16 18:00:02.0,0,3"]
    for name, lines in (("plain.csv", [header, *rows]), ("blank.csv", [header, "", *rows])):
        path = _write(tmp_path / name, lines)
        with pytest.raises(KvlabError) as err:
            load_azure(path)
        line = 3 if name == "plain.csv" else 4
        assert str(err.value) == (f"{path} line {line}, column ContextTokens: '0' is too "
                                  "small: expected a whole number >= 1")


def test_the_bundled_excerpt_loads_without_importing_pandas():
    code = ("import sys; from kvlab.traces import load_azure; "
            f"load_azure({str(bundled_trace_path('azure-conv'))!r}); "
            "print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
