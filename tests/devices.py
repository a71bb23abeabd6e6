"""The devices an engine or kernel test runs on: the CPU always, a CUDA GPU as a `cuda` case.

The `cuda` case is out of the default run (its marker) and skips with a reason where no GPU is
visible; `pytest -m cuda` on a GPU machine runs it.
"""

from __future__ import annotations

import pytest
import torch

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ],
)
DEVICES = ["cpu", CUDA]
