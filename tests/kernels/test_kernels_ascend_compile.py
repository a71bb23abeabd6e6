"""The static Ascend check: every ascend kernel, at the tiles the backend picks for each page
size, compiles for Ascend910B3 through bishengir-compile up to CANN's hivmc, inside UB and L1;
float caches and int8 ones (kv_cache_dtype int8, C8)."""

import pytest
from ascend_env import requires_bishengir

from kvlab.kernels.ascend_compile import (
    L1_BYTES,
    LLAMA3_8B,
    LLAMA3_8B_C8,
    STATIC_CHECK_PAGE_SIZES,
    UB_BYTES,
    HeadShape,
    static_check,
)

pytestmark = [pytest.mark.ascend, requires_bishengir]

KERNELS = ["write_kv_kernel", "decode_kernel", "prefill_kernel", "move_pages_kernel"]
SHAPES = {
    "llama3-8b bf16": LLAMA3_8B,
    "qwen2.5-7b fp16": HeadShape(28, 4, 128, "fp16"),
    "llama3-8b bf16 int8 kv": LLAMA3_8B_C8,
}


@pytest.fixture(scope="module", params=SHAPES.values(), ids=SHAPES.keys())
def shape(request):
    return request.param


@pytest.fixture(scope="module")
def rows(shape):
    return static_check(STATIC_CHECK_PAGE_SIZES, shape)


def test_every_kernel_is_compiled_at_every_page_size(rows):
    compiled = [(row.page_size, row.result.kernel) for row in rows]
    assert compiled == [(p, k) for p in STATIC_CHECK_PAGE_SIZES for k in KERNELS]


def test_every_kernel_reaches_the_last_step_inside_the_on_chip_buffers(rows):
    for row in rows:
        where = (row.page_size, row.result.kernel, row.constants)
        assert row.result.reached_last_step, (where, row.result.log[-2000:])
        assert not row.result.ub_overflow, (where, row.result.log[-2000:])
        assert 0 < row.result.ub_bytes <= UB_BYTES, (where, row.result.ub_bytes)
        assert row.result.l1_bytes <= L1_BYTES, (where, row.result.l1_bytes)
        assert row.result.passed


def test_attention_runs_on_cube_and_vector_cores_and_cache_ops_on_vector_cores(rows):
    modes = {row.result.kernel: row.result.mix_mode for row in rows if row.page_size == 128}
    assert modes == {
        "write_kv_kernel": "aiv",
        "decode_kernel": "mix",
        "prefill_kernel": "mix",
        "move_pages_kernel": "aiv",
    }


def test_the_checked_tiles_are_the_ones_the_backend_picks(rows, shape):
    from kvlab.kernels.ascend_tiles import context_tile

    for row in rows:
        if row.result.kernel in ("decode_kernel", "prefill_kernel"):
            assert row.constants["BLOCK_N"] == context_tile(row.page_size)
            assert row.constants["PAGE_SIZE"] == row.page_size
            assert row.constants["C8"] == int(shape.c8)  # int8 pages: the C8 kernels


def test_a_tile_larger_than_the_unified_buffer_fails_the_check():
    # 65,536 bf16 elements for K and V, double-buffered: 512 KiB, past the 192 KiB UB
    big = {"BLOCK": 65536, "NUM_CHUNKS": 1, "PAGE_NUMEL": 65536}
    rows = static_check((128,), LLAMA3_8B, overrides={"move_pages_kernel": big})
    (row,) = [r for r in rows if r.result.kernel == "move_pages_kernel"]
    assert row.result.ub_overflow
    assert not row.result.passed


def test_ub_and_l1_sizes_are_the_910b3s_as_bishengir_states_them(rows):
    from kvlab.kernels import ascendc_tiling

    sizes = rows[0].result.target_bytes
    assert sizes["UB_SIZE"] == UB_BYTES == ascendc_tiling.UB_BYTES == 192 * 1024
    assert sizes["L1_SIZE"] == L1_BYTES == 512 * 1024
    assert sizes["UB_ALIGN_SIZE"] == ascendc_tiling.UB_ALIGN_BYTES == 32
