"""The ascend backend's tile choices: what triton-ascend and the 910B allow, per page size."""

import math

import pytest

from kvlab.kernels.ascend_tiles import (
    MAX_PROGRAMS,
    context_tile,
    copy_tile,
    decode_constants,
    move_pages_constants,
    num_programs,
    prefill_constants,
)

TRITON_ASCEND_MAX_TENSOR_NUMEL = 1 << 20  # triton-ascend 3.2.0's TRITON_MAX_TENSOR_NUMEL
PAGE_SIZES = [16, 32, 48, 64, 80, 128, 192, 256, 512]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_a_context_tile_divides_the_page_and_is_at_most_128(page_size):
    tile = context_tile(page_size)
    assert page_size % tile == 0 and tile <= 128 and tile & (tile - 1) == 0
    assert tile == min(128, max(t for t in (16, 32, 64, 128, 256, 512) if page_size % t == 0))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(32, 8, 128), (28, 4, 128), (8, 1, 64)]
)
def test_every_tile_stays_under_triton_ascends_tensor_element_limit(
    page_size, num_heads, num_kv_heads, head_dim
):
    decode = decode_constants(page_size, num_heads, num_kv_heads, head_dim)
    prefill = prefill_constants(page_size, num_heads, num_kv_heads, head_dim)
    copy = move_pages_constants(page_size * num_kv_heads * head_dim)
    tiles = [
        (decode["BLOCK_G"], decode["BLOCK_D"]),
        (decode["BLOCK_N"], decode["BLOCK_D"]),
        (decode["BLOCK_G"], decode["BLOCK_N"]),
        (prefill["BLOCK_M"], prefill["BLOCK_N"]),
        (prefill["BLOCK_M"], prefill["BLOCK_D"]),
        (copy["BLOCK"],),
    ]
    assert all(math.prod(t) <= TRITON_ASCEND_MAX_TENSOR_NUMEL for t in tiles)
    # tl.dot's operands are padded to the Cube core's 16 x 16 fractal
    assert decode["BLOCK_G"] >= 16 and decode["BLOCK_D"] >= 16
    assert copy["NUM_CHUNKS"] * copy["BLOCK"] >= copy["PAGE_NUMEL"]


def test_small_pages_are_copied_as_one_tile():
    assert copy_tile(16 * 1 * 16) == 256 and copy_tile(128 * 8 * 128) == 8192


def test_launches_use_at_most_one_program_per_core_and_at_least_one():
    assert num_programs(0, 20) == 1
    assert num_programs(7, 20) == 7
    assert num_programs(10**6, 40) == 40
    assert num_programs(10**6, 10**6) == MAX_PROGRAMS
