"""Loader for a plain CSV of arrivals and lengths, the table users keep of their own traffic:
a time column and the prompt's and the answer's token counts, whatever their header calls them
(`timestamp,input_tokens,output_tokens`, `time;prompt_tokens;completion_tokens`, ...), any case,
separated by commas, semicolons or tabs. Times are seconds (epoch or since any origin) or
ISO-8601 date-times; arrivals count from the earliest."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.build import build_trace
from kvlab.traces.tabular import (
    check_file,
    raise_first_bad,
    read_labels,
    read_table,
    seconds,
    timestamps_ns,
    whole_numbers,
)
from kvlab.traces.types import Trace

# a column's names, lower case: the first the header has is the column
ALIASES = {
    "time": ("timestamp", "time", "arrival_s", "arrival_time", "arrival", "start_time"),
    "input": ("input_tokens", "prompt_tokens", "input_len", "input_length", "prompt_len",
              "prompt_length", "context_tokens", "request_tokens", "num_input_tokens"),
    "output": ("output_tokens", "completion_tokens", "output_len", "output_length",
               "generated_tokens", "response_tokens", "num_output_tokens"),
}
_WHAT = "a CSV of arrivals and lengths (a time column, input tokens, output tokens)"


def plain_columns(path: Path) -> tuple[str, dict[str, str]] | None:
    """(the separator, time/input/output -> the header's name for it) when `path`'s header
    names the three columns (ALIASES), else None."""
    check_file(path, _WHAT)
    with path.open(encoding="utf-8", errors="replace") as file:
        first = file.readline()
    sep = max((",", ";", "\t"), key=first.count)
    names = [name.strip() for name in first.strip().split(sep)]
    named: dict[str, str] = {}
    for column, aliases in ALIASES.items():
        found = next((n for n in names if n.lower() in aliases), None)
        if found is None:
            return None
        named[column] = found
    return sep, named


def load_plain_csv(path: str | Path, *, num_prompts: int | None = None) -> Trace:
    """Load a plain CSV of arrivals and lengths (see the module); a KvlabError naming the file,
    line and column for a bad value, or the columns it lacks."""
    path = Path(path)
    found = plain_columns(path)
    if found is None:
        raise KvlabError(
            f"{path} line 1: expected a header naming a time column ({', '.join(ALIASES['time'])}),"
            f" input tokens ({', '.join(ALIASES['input'][:4])}, ...) and output tokens "
            f"({', '.join(ALIASES['output'][:4])}, ...)", parameters=("dataset_path",))
    sep, named = found
    time, inputs, outputs = named["time"], named["input"], named["output"]
    table = read_table(path, (time, inputs, outputs), _WHAT, sep=sep)
    time_column = seconds(table, time)
    if time_column.bad().all():  # date-times, not numbers
        time_column = timestamps_ns(table, time)
    columns = {time: time_column, inputs: whole_numbers(table, inputs),
               outputs: whole_numbers(table, outputs)}
    labels = read_labels(table, columns)
    raise_first_bad(table, columns)
    values = np.asarray(time_column.values)
    # (int64 nanoseconds: subtracted before converting, so no digit is lost)
    arrival_s = (values - values.min()) / (1e9 if values.dtype.kind == "i" else 1.0)
    return build_trace(path, "csv", arrival_s, columns[inputs].values, columns[outputs].values,
                       num_prompts=num_prompts, labels=labels)
