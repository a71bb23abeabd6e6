"""lint/sizes.py, `make lint`'s size check: what it counts, and that the tree passes it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "lint" / "sizes.py"


@pytest.fixture(scope="module")
def sizes():
    spec = importlib.util.spec_from_file_location("lint_sizes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _function(name: str, num_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x = {line}\n" for line in range(num_lines - 1))
    return f"{indent}def {name}():\n{body}"


def test_functions_over_the_limit_are_named_with_their_class_and_length(sizes):
    limit = sizes.MAX_FUNCTION_LINES
    text = (_function("short", limit) + "class Room:\n" + _function("long", limit + 1, "    ")
            + _function("outer", limit + 5))
    assert sizes._long_functions(text) == [("Room.long", limit + 1), ("outer", limit + 5)]


def test_the_tree_passes_and_every_exception_gives_its_reason(sizes):
    exceptions = sizes.listed()
    assert exceptions and all(exceptions.values())
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
