"""Shared set-up of the validation tests: one torch thread (tiny matmuls on a shared machine)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """A second thread only waits on the first at these sizes."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)
