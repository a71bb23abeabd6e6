"""The platforms' page-size rules (specs.block_rules): Ascend's 128 under prefix caching or
chunked prefill and CANN's multiple of 16 up to 512; vLLM CPU's multiple of 32; CUDA's list."""

from __future__ import annotations

import pytest

from kvlab.specs import get_hardware
from kvlab.specs.block_rules import block_size_warnings, platform_of


@pytest.mark.parametrize("name, platform", [("atlas-800t-a2", "ascend"),
                                            ("ascend-910b", "ascend"), ("cpu", "cpu"),
                                            ("h100-80g", "cuda")])
def test_platforms_by_hardware_name(name, platform):
    assert platform_of(get_hardware(name)) == platform


@pytest.mark.parametrize("hardware, block_size, options, expected", [
    ("atlas-800t-a2", 128, {}, []),
    ("atlas-800t-a2", 16, {}, ["runs 128 whenever chunked prefill is on"]),
    ("atlas-800t-a2", 64, {"enable_chunked_prefill": False}, []),
    ("atlas-800t-a2", 64, {"enable_chunked_prefill": False, "enable_prefix_caching": True},
     ["runs 128 whenever prefix caching is on"]),
    ("atlas-800t-a2", 1024, {"enable_chunked_prefill": False}, ["multiple of 16 of at most 512"]),
    ("atlas-800t-a2", 7, {"enable_chunked_prefill": False}, ["multiple of 16"]),
    ("cpu", 16, {}, ["multiple of 32"]),
    ("cpu", 64, {}, []),
    ("a100-80g", 16, {}, []),
    ("a100-80g", 7, {}, ["takes one of 1, 8, 16, 32, 64, 128"]),
    ("a100-80g", 100000, {}, ["takes one of"]),
])
def test_block_size_warnings(hardware, block_size, options, expected):
    warnings = block_size_warnings(get_hardware(hardware), block_size, **options)
    assert len(warnings) == len(expected)
    for warning, text in zip(warnings, expected, strict=True):
        assert warning.startswith(f"block_size {block_size}: ") and text in warning
