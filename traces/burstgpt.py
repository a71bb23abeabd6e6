"""Loader for BurstGPT traces: CSV `Timestamp,Model,Request tokens,Response tokens,...`.

In BurstGPT a row with 0 response tokens is a failed request: it is skipped, counted in
`Trace.metadata["num_failed_skipped"]` and reported with a warning.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from kvlab.errors import KvlabError, KvlabWarning
from kvlab.traces.build import build_trace
from kvlab.traces.tabular import raise_first_bad, read_table, seconds, whole_numbers
from kvlab.traces.types import Trace

COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
_WHAT = ("a BurstGPT trace CSV "
         "(Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type)")


def load_burstgpt(path: str | Path, *, num_prompts: int | None = None) -> Trace:
    """Load a BurstGPT trace: arrival = Timestamp (seconds) minus the earliest one.

    Only Timestamp, Request tokens and Response tokens are read; other columns may be absent.
    """
    path = Path(path)
    table = read_table(path, COLUMNS, _WHAT)
    columns = {
        "Timestamp": seconds(table, "Timestamp"),
        "Request tokens": whole_numbers(table, "Request tokens"),
        "Response tokens": whole_numbers(table, "Response tokens", min_value=0),
    }
    raise_first_bad(table, columns)
    ok = columns["Response tokens"].values > 0
    num_failed = int((~ok).sum())
    if num_failed:
        warnings.warn(f"{path}: skipped {num_failed} failed requests (0 response tokens)",
                      KvlabWarning, stacklevel=2)
    if not ok.any():
        raise KvlabError(f"{path}: every request failed (0 response tokens); nothing to replay")
    arrival_s = columns["Timestamp"].values[ok]
    return build_trace(
        path,
        "burstgpt",
        arrival_s - arrival_s.min(),
        columns["Request tokens"].values[ok],
        columns["Response tokens"].values[ok],
        num_prompts=num_prompts,
        metadata={"num_failed_skipped": num_failed},
    )
