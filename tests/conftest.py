"""Test-wide set-up."""

import os

# Triton kernels run on CPU tensors through Triton's interpreter in CI. It must be set before any
# Triton kernel module is imported; an explicit TRITON_INTERPRET=0 (a GPU machine) is respected.
os.environ.setdefault("TRITON_INTERPRET", "1")
