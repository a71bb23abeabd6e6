"""Kernel tests run Triton kernels in its CPU interpreter: the switch must precede their import."""

import os

# triton.jit picks interpreter or compiler when a kernel is defined, so this must be set before
# any test imports kvlab.kernels.triton_backend (the tests import it lazily, inside each test)
os.environ["TRITON_INTERPRET"] = "1"
