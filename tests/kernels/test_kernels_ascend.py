"""The ascend backend's Triton kernels in Triton's CPU interpreter, against the torch reference.

They use plain triton.language only, so they run under the project's Triton and, in `make
test-ascend`, under triton-ascend 3.2.0's interpreter (test_runs_on_triton_ascend says which).
fp32 throughout: the interpreter's bf16 arithmetic is wrong. Shapes are tiny: it is slow.
"""

import os

import pytest
import torch
from ascend_env import requires_triton_ascend
from kernel_cases import (
    contiguous_attention,
    make_case,
    max_relative_error,
    write_kv_beside_reference,
)

from kvlab.errors import KvlabError
from kvlab.kernels import get_backend

pytest.importorskip("triton")

TOL = 1e-5  # fp32 relative error


@pytest.fixture(scope="module")
def ascend():
    return get_backend("ascend")


def _check(case, backend):
    args = (case.query, case.k_cache, case.v_cache, case.meta)
    kwargs = dict(scale=case.scale, num_kv_heads=case.num_kv_heads)
    out = torch.full_like(case.query, float("nan"))
    result = backend.paged_attention(*args, **kwargs, out=out)
    assert result is out
    expected = get_backend("torch").paged_attention(*args, **kwargs)
    assert max_relative_error(out, expected) < TOL
    assert max_relative_error(out, contiguous_attention(case)) < TOL


@pytest.mark.parametrize("page_size", [16, 48, 128, 512])
def test_mixed_prefill_chunks_and_decodes_match_reference(ascend, page_size):
    case = make_case([37, 150, 1, 9, 200], [37, 20, 1, 1, 1], page_size=page_size, head_dim=8)
    _check(case, ascend)


@pytest.mark.parametrize("run_pages", [2, 4])
def test_runs_of_pages_as_dynamic_block_sizes_match_reference(ascend, run_pages):
    # runs of 2^k pages: extents longer than one page and one tile, cut by the context's end
    case = make_case([300, 77, 129], [1, 40, 1], page_size=16, run_pages=run_pages, head_dim=8)
    _check(case, ascend)


def test_one_contiguous_region_per_sequence_matches_reference(ascend):
    case = make_case([260, 45], [1, 45], page_size=16, shuffle=False, head_dim=8)
    _check(case, ascend)


def test_prefill_chunk_after_a_long_cached_prefix_matches_reference(ascend):
    case = make_case([190, 70], [70, 70], page_size=32, head_dim=8)
    _check(case, ascend)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (8, 1)])
def test_grouped_query_heads_match_reference(ascend, num_heads, num_kv_heads):
    case = make_case(
        [40, 21], [15, 1], page_size=16, num_heads=num_heads, num_kv_heads=num_kv_heads
    )
    _check(case, ascend)


def test_head_dim_not_a_power_of_two_matches_reference(ascend):
    case = make_case([33, 17], [33, 1], page_size=16, head_dim=24)
    _check(case, ascend)


def test_more_work_items_than_programs_loop_in_each_program(ascend):
    # 50 decodes x 2 KV heads = 100 items over at most 20 programs (the 910B3's AI cores)
    case = make_case([3 + i for i in range(50)], [1] * 50, page_size=16, head_dim=8)
    _check(case, ascend)


def test_write_kv_matches_reference_and_skips_minus_one(ascend):
    for ours, reference in write_kv_beside_reference(ascend):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0, equal_nan=True)


def test_copy_pages_copies_disjoint_pairs(ascend):
    k_cache, v_cache = torch.randn(6, 16, 2, 8), torch.randn(6, 16, 2, 8)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    pairs = torch.tensor([[0, 4], [2, 5]])
    ascend.copy_pages(k_cache, v_cache, pairs)
    get_backend("torch").copy_pages(expected_k, expected_v, pairs)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_copy_pages_reads_every_source_before_writing(ascend):
    k_cache, v_cache = torch.randn(3, 16, 2, 8), torch.randn(3, 16, 2, 8)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    ascend.copy_pages(k_cache, v_cache, torch.tensor([[0, 1], [1, 2]]))
    assert torch.equal(k_cache[1], k_before[0]) and torch.equal(k_cache[2], k_before[1])
    assert torch.equal(v_cache[2], v_before[1]) and torch.equal(v_cache[0], v_before[0])


def test_copy_of_pages_larger_than_one_copy_tile_is_exact(ascend):
    # 128 x 8 x 16 = 16,384 elements: two chunks of the 8,192-element copy tile
    k_cache, v_cache = torch.randn(3, 128, 8, 16), torch.randn(3, 128, 8, 16)
    before = k_cache.clone()
    ascend.copy_pages(k_cache, v_cache, torch.tensor([[2, 0]]))
    assert torch.equal(k_cache[0], before[2]) and torch.equal(k_cache[1:], before[1:])


def test_swap_out_then_in_restores_pages_bit_exact(ascend):
    dev_k, dev_v = torch.randn(5, 16, 2, 8), torch.randn(5, 16, 2, 8)
    host_k, host_v = torch.zeros(3, 16, 2, 8), torch.zeros(3, 16, 2, 8)
    original = dev_k[[1, 3]].clone(), dev_v[[1, 3]].clone()
    ascend.swap_pages(dev_k, dev_v, host_k, host_v, torch.tensor([[1, 2], [3, 0]]))
    assert torch.equal(host_k[2], original[0][0]) and torch.equal(host_v[0], original[1][1])
    ascend.swap_pages(host_k, host_v, dev_k, dev_v, torch.tensor([[2, 4], [0, 0]]))
    assert torch.equal(dev_k[[4, 0]], original[0]) and torch.equal(dev_v[[4, 0]], original[1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float8_e4m3fn])
def test_dtypes_triton_ascend_lacks_are_a_kvlab_error(ascend, dtype):
    cache = torch.zeros(2, 16, 2, 8).to(dtype)
    with pytest.raises(KvlabError, match="float16, bfloat16 or float32 caches"):
        ascend.copy_pages(cache, cache.clone(), torch.tensor([[0, 1]]))


@pytest.mark.parametrize("page_size", [8, 24, 1024])
def test_page_sizes_outside_16_to_512_are_a_kvlab_error(ascend, page_size):
    case = make_case([10], [10], page_size=page_size)
    with pytest.raises(KvlabError, match=f"page size \\(--block-size\\) {page_size} "):
        _check(case, ascend)


def test_cpu_without_the_interpreter_says_how(ascend, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KvlabError, match="needs Triton's interpreter"):
        ascend.check_device(torch.device("cpu"))


@pytest.mark.ascend
@requires_triton_ascend
def test_runs_on_triton_ascends_interpreter():
    import triton

    assert triton.__version__ == "3.2.0"
    assert os.environ.get("TRITON_INTERPRET") == "1"
