"""MkDocs hook: mkdocstrings reads kvlab's source as the package `kvlab`, but the checkout's
folders are named apart from their import (policies/ is kvlab.policies, kvcore/ is kvlab:
setup.py's FOLDERS). Before the build, build/apisrc/kvlab is laid out as the package, of
symbolic links to the checkout's files, and mkdocs.yml points mkdocstrings at build/apisrc."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "apisrc"


def folders() -> dict[str, str]:
    """setup.py's FOLDERS (checkout folder -> package), read from its source."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets):
            mapping: dict[str, str] = ast.literal_eval(node.value)
            return mapping
    raise RuntimeError("setup.py has no FOLDERS")


def lay_out(tree: Path = TREE) -> None:
    """Make `tree`/kvlab/... mirror the installed package, each entry a link to the checkout."""
    shutil.rmtree(tree, ignore_errors=True)
    for folder, package in sorted(folders().items(), key=lambda item: item[1].count(".")):
        target = tree.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for entry in (ROOT / folder).iterdir():
            link = target / entry.name
            if entry.name == "__pycache__" or link.exists():
                continue
            link.symlink_to(entry, target_is_directory=entry.is_dir())


def on_startup(command: str, dirty: bool) -> None:
    """Lay out build/apisrc before mkdocstrings reads it: at start-up, before any plugin's
    config, since its Python handler keeps only the `paths` that exist when the config loads
    (on_pre_build was too late: a fresh clone's first build found no module)."""
    lay_out()
