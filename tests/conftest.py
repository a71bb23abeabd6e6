"""Test-wide set-up."""

import importlib
import importlib.util
import os
from pathlib import Path

# Triton kernels run on CPU tensors through Triton's interpreter in CI. It must be set before any
# Triton kernel module is imported; an explicit TRITON_INTERPRET=0 (a GPU machine) is respected.
os.environ.setdefault("TRITON_INTERPRET", "1")
# torch_npu installed without CANN would break `import torch` through torch's backend autoload;
# kvlab imports torch_npu itself where an npu is chosen (test modules import torch before kvlab)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from hypothesis import HealthCheck, settings

import kvlab  # importing kvlab puts the checkout after the installed packages on sys.path


def _import_pypi_kernels() -> None:
    """Import Hugging Face's `kernels`, if installed, while the checkout is last on sys.path.

    pytest puts the checkout first again as it imports test modules, where kernels/ would shadow
    the package that transformers >= 5.25 imports; once imported, it stays the one found.
    """
    spec = importlib.util.find_spec("kernels")
    own = Path(kvlab.__file__).resolve().parents[1] / "kernels" / "__init__.py"
    if spec is not None and spec.origin and Path(spec.origin).resolve() != own:
        importlib.import_module("kernels")


_import_pypi_kernels()

# `HYPOTHESIS_PROFILE=thorough pytest tests/policies` runs 20x more random cases.
settings.register_profile(
    "default", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
