"""The AscendC kernels' tiling plan: every buffer fits a 910B vector core's Unified Buffer, tiles
divide pages, K/V tiles are double-buffered, and the plan's names are the C++ ops' arguments."""

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.kernels.ascendc_tiling import (
    BUFFER_NUM,
    UB_ALIGN_BYTES,
    UB_BYTES,
    copy_pages_plan,
    decode_supported,
    paged_decode_plan,
    swap_runs,
)

ASCENDC = Path(__file__).parents[2] / "kvkernels" / "ascendc"
PAGE_SIZES = [16, 32, 48, 64, 128, 256, 512]


def test_ub_is_the_910bs_192_kib():
    assert UB_BYTES == 192 * 1024


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 2, 4, 7, 8, 16])
@pytest.mark.parametrize("element_bytes", [2])  # float16, bfloat16
def test_decode_plan_fits_the_unified_buffer(page_size, head_dim, group, element_bytes):
    plan = paged_decode_plan(page_size, head_dim, group, element_bytes, num_items=64)
    assert plan.fits and plan.ub_bytes <= UB_BYTES
    tile = plan.launch["tile_tokens"]
    assert page_size % tile == 0 and tile <= 128
    assert all(b.total_bytes % UB_ALIGN_BYTES == 0 for b in plan.buffers)
    depth = {b.name: b.depth for b in plan.buffers}
    assert depth["K tile in"] == depth["V tile in"] == BUFFER_NUM == 2
    if tile < min(page_size & -page_size, 128):  # shrunk: the doubled tile would not fit
        bigger = paged_decode_plan(2 * tile, head_dim, group, element_bytes, 64)
        assert bigger.launch["tile_tokens"] == tile


def test_decode_plan_counts_every_buffer_the_kernel_allocates():
    plan = paged_decode_plan(128, 128, 4, 2, num_items=64)
    # with 128-token tiles the buffers would take 201 KiB: the plan halves the tile
    n = plan.launch["tile_tokens"]
    assert n == 64
    # paged_decode_kernel.cpp: q_in, k_in x2, v_in x2, out, q_f32, kv_f32, scores, acc, row, work
    g, d = 4, 128
    expected = (
        g * d * 2
        + 2 * n * d * 2 * 2
        + g * d * 2
        + g * d * 4
        + n * d * 4
        + g * n * 4
        + g * d * 4
        + d * 4
        + max(d, n) * 4
    )
    assert plan.ub_bytes == expected
    kernel = (ASCENDC / "paged_decode_kernel.cpp").read_text()
    assert len(re.findall(r"pipe_\.InitBuffer\(", kernel)) == len(plan.buffers)


def test_decode_uses_at_most_one_core_per_item_and_all_vector_cores():
    assert paged_decode_plan(128, 128, 4, 2, num_items=3).launch["block_dim"] == 3
    assert paged_decode_plan(128, 128, 4, 2, num_items=500).launch["block_dim"] == 40


def test_decode_takes_up_to_16_query_heads_per_kv_head():
    assert decode_supported(16, 128) and not decode_supported(17, 128)
    assert not decode_supported(4, 100)  # rows of 32-byte blocks


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(1, 64), (8, 128), (16, 256)])
def test_copy_plan_tiles_divide_the_page_and_fit_double_buffered(page_size, num_kv_heads, head_dim):
    page_elems = page_size * num_kv_heads * head_dim
    plan = copy_pages_plan(page_elems, 2, num_pairs=10)
    tile = plan.launch["tile_elems"]
    assert page_elems % tile == 0 and tile * 2 % UB_ALIGN_BYTES == 0
    assert plan.buffers[0].depth == 2 and plan.fits
    assert plan.launch["block_dim"] == min(40, 10 * 2 * page_elems // tile)


def test_plan_launch_arguments_are_the_torch_ops_schema_names():
    source = (ASCENDC / "torch_ops.cpp").read_text()
    joined = re.sub(r'"\s*\n\s*"', "", source)  # adjacent C++ string literals
    schemas = dict(re.findall(r'm\.def\("(\w+)\((.*?)\) -> \(\)"\)', joined))
    for op, plan in (
        ("copy_pages", copy_pages_plan(4096, 2, 1)),
        ("paged_decode", paged_decode_plan(128, 128, 4, 2, 1)),
    ):
        names = [arg.split()[-1] for arg in schemas[op].split(",")]
        assert names[-len(plan.launch) :] == list(plan.launch), op


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=12))
def test_swap_runs_cover_every_pair_and_merge_only_consecutive_ones(pairs):
    page_bytes = 64
    runs = swap_runs(pairs, page_bytes)
    expanded = [
        ((src + i * page_bytes) // page_bytes, (dst + i * page_bytes) // page_bytes)
        for src, dst, size in runs
        for i in range(size // page_bytes)
    ]
    assert expanded == pairs
    breaks = sum(1 for a, b in itertools.pairwise(pairs) if (b[0], b[1]) != (a[0] + 1, a[1] + 1))
    assert len(runs) == (breaks + 1 if pairs else 0)
