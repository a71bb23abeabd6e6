"""Loader for the Azure LLM inference traces: CSV `TIMESTAMP,ContextTokens,GeneratedTokens`,
with optional columns `priority` (a whole number, lower first under priority scheduling) and
`slo_class` (the class a request's latencies are reported in)."""

from __future__ import annotations

from pathlib import Path

from kvlab.traces.build import build_trace
from kvlab.traces.tabular import (
    raise_first_bad,
    read_labels,
    read_table,
    timestamps_ns,
    whole_numbers,
)
from kvlab.traces.types import Trace

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_WHAT = "an Azure LLM inference trace CSV"


def load_azure(path: str | Path, *, num_prompts: int | None = None) -> Trace:
    """Load an Azure trace: arrival = seconds since the earliest TIMESTAMP.

    Timestamps look like `2023-11-16 18:15:46.6805900` (any ISO-8601 date-time is accepted);
    rows out of time order are sorted, ties kept in file order.
    """
    path = Path(path)
    table = read_table(path, COLUMNS, _WHAT)
    columns = {
        "TIMESTAMP": timestamps_ns(table, "TIMESTAMP"),
        "ContextTokens": whole_numbers(table, "ContextTokens"),
        "GeneratedTokens": whole_numbers(table, "GeneratedTokens"),
    }
    labels = read_labels(table, columns)
    raise_first_bad(table, columns)
    # Subtract in integer nanoseconds before converting, so the 100 ns digits survive.
    arrival_ns = columns["TIMESTAMP"].values
    arrival_s = (arrival_ns - arrival_ns.min()) / 1e9
    return build_trace(
        path,
        "azure",
        arrival_s,
        columns["ContextTokens"].values,
        columns["GeneratedTokens"].values,
        num_prompts=num_prompts,
        labels=labels,
    )
