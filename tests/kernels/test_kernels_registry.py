"""get_backend and available_backends: names, errors and lazy imports."""

import subprocess
import sys

import pytest

from kvlab.errors import KvlabError
from kvlab.kernels import available_backends, backend_names, get_backend


def test_torch_backend_is_always_available():
    assert "torch" in available_backends()
    assert get_backend("torch").name == "torch"


def test_unknown_backend_names_the_valid_ones():
    with pytest.raises(KvlabError, match="unknown attention backend 'cuda'") as err:
        get_backend("cuda")
    for name in backend_names():
        assert name in str(err.value)


def test_importing_the_api_imports_no_backend_module():
    code = (
        "import sys, kvlab.kernels as k; k.get_backend('torch'); "
        "print(sorted(m for m in sys.modules if m.startswith('kvlab.kernels.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == (
        "['kvlab.kernels.backend', 'kvlab.kernels.metadata', 'kvlab.kernels.torch_backend']"
    )
