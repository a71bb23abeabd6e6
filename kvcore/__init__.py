"""kvlab: a laboratory for KV-cache memory management in LLM inference."""

import os

# `import torch` imports every installed device backend; torch_npu on a machine without CANN
# then breaks torch itself. kvlab imports torch_npu explicitly where an npu is chosen.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

__version__ = "0.1.0"
