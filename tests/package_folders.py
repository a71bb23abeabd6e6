"""setup.py's map of the checkout's top-level folders to kvlab's subpackages, read from its source
(setup.py runs setup() when imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_folders() -> dict[str, str]:
    """Each top-level folder that setup.py maps, with the package it is (`kvkernels`:
    `kvlab.kernels`)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets
        ):
            folders: dict[str, str] = ast.literal_eval(node.value)
            return folders
    raise AssertionError("setup.py has no FOLDERS")
