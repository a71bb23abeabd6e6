"""Skip markers for tests that need the `make ascend-env` venv (triton-ascend, ascendnpu-ir)."""

import importlib.util

import pytest


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


requires_triton_ascend = pytest.mark.skipif(
    not _has("triton.backends.ascend"),
    reason="needs triton-ascend (make ascend-env; make test-ascend runs these)",
)
requires_bishengir = pytest.mark.skipif(
    not (_has("triton.backends.ascend") and _has("ascendnpuir")),
    reason="needs triton-ascend and ascendnpu-ir's bishengir-compile (make ascend-env)",
)
