"""kvlab: a laboratory for KV-cache memory management in LLM inference."""

import os
import sys
from pathlib import Path

# `import torch` imports every installed device backend; torch_npu on a machine without CANN
# then breaks torch itself. kvlab imports torch_npu explicitly where an npu is chosen.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

# In a checkout, the top-level folders are kvlab's subpackages (setup.py maps kernels/ to
# kvlab.kernels). Python started in the checkout, or pytest, puts it first on sys.path, where a
# folder shadows the PyPI package of its name: transformers >= 5.25 imports Hugging Face's
# `kernels` and would get kernels/. The checkout stays importable (tests.*), after the packages.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "setup.py").is_file():
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _CHECKOUT] + [str(_CHECKOUT)]

__version__ = "0.1.0"
