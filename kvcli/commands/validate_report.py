"""Where a `kvlab validate` report goes and how it is written (the plain and the KV-event
validation alike)."""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path
from typing import Any


def report_path(args: argparse.Namespace, default_stem: str) -> Path:
    """Where a validate report goes: --result-dir / (--result-filename, else
    `<default_stem>-<date>.json`)."""
    from pathlib import Path

    name = args.result_filename or f"{default_stem}-{datetime.now():%Y%m%d-%H%M%S}.json"
    return Path(args.result_dir) / name


def save_document(path: Path, document: dict[str, Any]) -> None:
    """Write a report as JSON (parents created) and say so; a KvlabError naming the path."""
    import json

    from kvlab.errors import write_text_file

    write_text_file(path, json.dumps(document, indent=2, allow_nan=False, default=str) + "\n")
    print(f"Saved {path}")
