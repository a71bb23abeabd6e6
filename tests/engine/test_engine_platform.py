"""Platforms answer for their device, and refuse devices this machine lacks with a reason."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvlab.engine.platform import get_platform
from kvlab.errors import KvlabError


def test_cpu_reports_its_memory():
    platform = get_platform("cpu")
    assert platform.device == torch.device("cpu") and not platform.pin_memory
    assert 0 < platform.free_memory_bytes() <= platform.total_memory_bytes()


def test_cpu_streams_are_no_ops():
    platform = get_platform("cpu")
    stream = platform.new_stream()
    with platform.stream(stream):
        value = torch.ones(2).sum()
    platform.synchronize()
    platform.empty_cache()
    assert stream is None and value == 2


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu", ""])
def test_unknown_device_lists_the_known_ones(device):
    with pytest.raises(KvlabError, match="expected one of cpu, cuda, npu"):
        get_platform(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(KvlabError, match="no CUDA GPU is visible"):
        get_platform("cuda")


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed"
)
def test_npu_without_torch_npu_says_what_is_missing():
    with pytest.raises(KvlabError, match="needs torch_npu and the Ascend CANN toolkit"):
        get_platform("npu")


@pytest.mark.cuda
def test_cuda_reports_memory_and_pins_host_memory():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    platform = get_platform("cuda")
    assert platform.pin_memory
    assert 0 < platform.free_memory_bytes() <= platform.total_memory_bytes()
    platform.reset_peak_memory_stats()
    before = platform.memory_allocated_bytes()
    block = torch.empty(1 << 20, dtype=torch.uint8, device=platform.device)
    assert platform.peak_memory_allocated_bytes() - before >= 1 << 20
    del block
