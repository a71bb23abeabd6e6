"""`make lint`'s size check: no module over MAX_MODULE_LINES lines and no function over
MAX_FUNCTION_LINES lines (its `def` to its last line, docstring and comments included) in the
project's folders, but for those listed in `lint/size_exceptions.txt`, each with its reason.

Usage: python lint/sizes.py [--list]   (--list: print every offender, listed or not)
Exit status 1, with one line per offender, when a file or function over its limit is not
listed, or a listed one is no longer over it (so the list shrinks as rooms are split).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# the project's source folders (setup.py's FOLDERS), its tests, benchmarks and this folder
FOLDERS = ("kvcore", "kvcli", "policies", "sim", "engine", "kvkernels", "traces", "metrics",
           "specs", "fidelity", "server", "kvbench", "sweep", "dashboard", "integrations", "plots",
           "benchmarks", "docs_hooks", "lint")
# generated or kernel code: not held to the limits (Triton and AscendC kernels are long by
# their nature, one program per function)
SKIPPED = ("kvkernels/ascendc/",)
EXCEPTIONS = Path(__file__).with_name("size_exceptions.txt")


def offenders() -> list[str]:
    """Each module and function over its limit, as `path` or `path::qualified.name`, with its
    line count: `name lines`."""
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(SKIPPED):
                continue
            text = path.read_text(encoding="utf-8")
            num_lines = text.count("\n")
            if num_lines > MAX_MODULE_LINES:
                found.append(f"{relative} {num_lines}")
            found += [f"{relative}::{name} {lines}" for name, lines in _long_functions(text)]
    return found


def _long_functions(text: str) -> list[tuple[str, int]]:
    """(qualified name, lines) of each function longer than MAX_FUNCTION_LINES."""
    long: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append((name, lines))
                visit(child, f"{name}.")

    visit(ast.parse(text), "")
    return long


def listed() -> dict[str, str]:
    """The exceptions file: `name  # reason` per line (blank and comment lines skipped)."""
    exceptions = {}
    for number, line in enumerate(EXCEPTIONS.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, _, reason = line.partition("#")
        if not reason.strip():
            sys.exit(f"{EXCEPTIONS.name}:{number}: expected `name  # reason`, got {line!r}")
        exceptions[name.strip()] = reason.strip()
    return exceptions


def main() -> int:
    """Compare the offenders with the exceptions file; 1 where they differ."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every offender")
    args = parser.parse_args()
    found = dict(entry.rsplit(" ", 1) for entry in offenders())
    if args.list:
        print("\n".join(f"{name} {lines}" for name, lines in found.items()))
        return 0
    exceptions = listed()
    errors = [f"{name}: {lines} lines, over the limit of "
              f"{MAX_FUNCTION_LINES if '::' in name else MAX_MODULE_LINES}: split it (or list "
              f"it in lint/{EXCEPTIONS.name} with the reason)"
              for name, lines in found.items() if name not in exceptions]
    errors += [f"lint/{EXCEPTIONS.name}: {name} is no longer over its limit: take it off the list"
               for name in exceptions if name not in found]
    if errors:
        print("\n".join(errors), file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
