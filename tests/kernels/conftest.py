"""Kernel tests run Triton kernels in its CPU interpreter: the switch must precede their import."""

import os

# triton.jit picks interpreter or compiler when a kernel is defined, so this must be set before
# any test imports kvlab.kernels.triton_backend (the tests import it lazily, inside each test).
# An explicit TRITON_INTERPRET=0 (`pytest -m cuda` on a GPU machine) is respected, as in the
# root conftest: forcing 1 here would turn the engine's CUDA tests, collected beside these,
# into interpreted ones.
os.environ.setdefault("TRITON_INTERPRET", "1")
