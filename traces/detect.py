"""Guess which loader reads a trace file, from its extension or its CSV header."""

from __future__ import annotations

from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.traces.plain_csv import plain_columns
from kvlab.traces.tabular import check_file

_ANY_TRACE = "a trace file (.csv, .jsonl or .json) or a workload spec (.yaml)"


def guess_dataset_name(path: str | Path) -> str:
    """'mooncake' for .jsonl, 'sharegpt' for .json, 'workload' for a .yaml workload spec, else
    'azure', 'burstgpt' or a plain 'csv' of arrivals and lengths by CSV header."""
    path = Path(path)
    check_file(path, _ANY_TRACE)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "mooncake"
    if suffix == ".json":
        return "sharegpt"
    if suffix in (".yaml", ".yml"):
        return "workload"
    with path.open(encoding="utf-8", errors="replace") as file:
        header = [name.strip() for name in file.readline().split(",")]
    if "ContextTokens" in header:
        return "azure"
    if "Request tokens" in header:
        return "burstgpt"
    if plain_columns(path) is not None:
        return "csv"
    raise KvlabError(
        f"{path} line 1: cannot tell the dataset from the header {','.join(header)!r}; expected "
        "an Azure (TIMESTAMP,ContextTokens,GeneratedTokens) or BurstGPT (Timestamp,Model,"
        "Request tokens,Response tokens,...) header, or a time column with input and output "
        "token counts (timestamp,input_tokens,output_tokens, ...), or give dataset_name",
        parameters=("dataset_name",),
    )
