"""Test-wide set-up."""

import os

# Triton kernels run on CPU tensors through Triton's interpreter in CI. It must be set before any
# Triton kernel module is imported; an explicit TRITON_INTERPRET=0 (a GPU machine) is respected.
os.environ.setdefault("TRITON_INTERPRET", "1")
# torch_npu installed without CANN would break `import torch` through torch's backend autoload;
# kvlab imports torch_npu itself where an npu is chosen (test modules import torch before kvlab)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from hypothesis import HealthCheck, settings

# `HYPOTHESIS_PROFILE=thorough pytest tests/policies` runs 20x more random cases.
settings.register_profile(
    "default", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
