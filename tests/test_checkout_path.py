"""Python started in the checkout imports third-party packages, not kvlab's folders.

The working directory comes first on sys.path (`python -c`, `python -m`, a REPL, a notebook), so
a top-level folder with an __init__.py named like an installed package would shadow it
(transformers imports Hugging Face's `kernels`; a vLLM with kvlab's plugin imports `kvlab`).
setup.py therefore maps folders of names no installed package uses (kvkernels/ is kvlab.kernels,
kvcore/ is kvlab itself).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from tests.package_folders import ROOT, package_folders

PEER_PYTHON = ROOT / ".peer/vllm/bin/python"


def _top_level_folders() -> set[str]:
    """The checkout's top-level folders that Python would import as packages."""
    return {p.parent.name for p in ROOT.glob("*/__init__.py")}


def test_no_mapped_folder_is_named_like_an_installed_package() -> None:
    installed = set(packages_distributions()) - {"kvlab"}
    clashes = sorted(set(package_folders()) & (installed | {"kvlab"}))
    assert not clashes, f"top-level folders {clashes} shadow installed packages of their names"


def test_every_package_folder_is_mapped_by_setup() -> None:
    assert set(package_folders()) <= _top_level_folders()
    assert set(package_folders().values()) >= {"kvlab", "kvlab.kernels", "kvlab.policies"}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="no transformers")
def test_transformers_imports_in_the_checkout() -> None:
    """transformers imports Hugging Face's `kernels` when installed (the issue's failing line)."""
    code = ("from transformers import Qwen2ForCausalLM; import importlib.util, sys; "
            "spec = importlib.util.find_spec('kernels'); "
            "print(spec.origin if spec else 'absent')")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not result.stdout.strip().startswith(str(ROOT) + "/kv"), result.stdout


@pytest.mark.peer
@pytest.mark.skipif(not PEER_PYTHON.exists(), reason="no peer vLLM (make vllm-peer)")
def test_the_peer_vllm_and_its_kvlab_plugin_import_in_the_checkout() -> None:
    """vLLM started in the checkout gets the kvlab it has installed (make vllm-plugin), whole."""
    code = ("import vllm, kvlab, kvlab.policies; from vllm import LLM; "
            "print(kvlab.__file__)")
    result = subprocess.run([str(PEER_PYTHON), "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not Path(result.stdout.strip()).is_relative_to(ROOT / "kvcore"), result.stdout
