"""The Triton backend, run by Triton's CPU interpreter, against the torch reference backend."""


import pytest
import torch
from kernel_cases import (
    make_case,
    max_relative_error,
    run_without_interpreter,
    write_kv_beside_reference,
)

from kvlab.kernels import get_backend

TOL = 1e-5  # fp32 relative error


def _triton(**kwargs):
    from kvlab.kernels.triton_backend import TritonBackend

    return TritonBackend(**kwargs)


def _both(case, backend):
    """The backend's output (into a NaN-poisoned buffer) and the reference's."""
    args = (case.query, case.k_cache, case.v_cache, case.meta)
    kwargs = dict(scale=case.scale, num_kv_heads=case.num_kv_heads)
    out = torch.full_like(case.query, float("nan"))
    backend.paged_attention(*args, **kwargs, out=out)
    return out, get_backend("torch").paged_attention(*args, **kwargs)


@pytest.mark.parametrize("page_size", [16, 128])
def test_mixed_prefill_chunks_and_decodes_match_reference(page_size):
    case = make_case([37, 150, 1, 9, 200], [37, 20, 1, 1, 1], page_size=page_size)
    out, expected = _both(case, _triton())
    assert max_relative_error(out, expected) < TOL


def test_partitioned_decode_of_ragged_contexts_matches_reference():
    # contexts below, at and across the 64-token partition boundary
    case = make_case([3, 64, 65, 200, 129], [1] * 5, page_size=16)
    out, expected = _both(case, _triton(partition_size=64))
    assert max_relative_error(out, expected) < TOL


def test_prefill_chunk_after_a_long_cached_prefix_matches_reference():
    case = make_case([190, 70], [70, 70], page_size=32)
    out, expected = _both(case, _triton())
    assert max_relative_error(out, expected) < TOL


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (8, 1)])
def test_grouped_query_heads_match_reference(num_heads, num_kv_heads):
    case = make_case(
        [40, 21], [15, 1], page_size=16, num_heads=num_heads, num_kv_heads=num_kv_heads
    )
    out, expected = _both(case, _triton())
    assert max_relative_error(out, expected) < TOL


def test_head_dim_not_a_power_of_two_matches_reference():
    case = make_case([33, 17], [33, 1], page_size=16, head_dim=24)
    out, expected = _both(case, _triton())
    assert max_relative_error(out, expected) < TOL


def test_query_and_output_may_be_strided_views():
    case = make_case([30, 12], [30, 1], page_size=16)
    packed = torch.cat([case.query, torch.zeros_like(case.query)], dim=1)  # like a fused qkv
    query = packed[:, : case.query.shape[1]]
    out_packed = torch.full_like(packed, float("nan"))
    out = out_packed[:, : case.query.shape[1]]
    _triton().paged_attention(
        query,
        case.k_cache,
        case.v_cache,
        case.meta,
        scale=case.scale,
        num_kv_heads=case.num_kv_heads,
        out=out,
    )
    _, expected = _both(case, _triton())
    assert max_relative_error(out, expected) < TOL
    assert bool(out_packed[:, case.query.shape[1] :].isnan().all())


def test_write_kv_matches_reference_and_skips_minus_one():
    for ours, reference in write_kv_beside_reference(_triton()):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0, equal_nan=True)


def test_copy_pages_copies_disjoint_pairs():
    k_cache, v_cache = torch.randn(6, 16, 2, 8), torch.randn(6, 16, 2, 8)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    pairs = torch.tensor([[0, 4], [2, 5]])
    _triton().copy_pages(k_cache, v_cache, pairs)
    get_backend("torch").copy_pages(expected_k, expected_v, pairs)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_copy_pages_reads_every_source_before_writing():
    k_cache, v_cache = torch.randn(3, 16, 2, 8), torch.randn(3, 16, 2, 8)
    k_before = k_cache.clone()
    _triton().copy_pages(k_cache, v_cache, torch.tensor([[0, 1], [1, 2]]))
    assert torch.equal(k_cache[1], k_before[0]) and torch.equal(k_cache[2], k_before[1])


def test_swap_out_then_in_restores_pages_bit_exact():
    backend = _triton()
    dev_k, dev_v = torch.randn(5, 16, 2, 8), torch.randn(5, 16, 2, 8)
    host_k, host_v = torch.zeros(3, 16, 2, 8), torch.zeros(3, 16, 2, 8)
    original = dev_k[[1, 3]].clone(), dev_v[[1, 3]].clone()
    backend.swap_pages(dev_k, dev_v, host_k, host_v, torch.tensor([[1, 2], [3, 0]]))
    backend.swap_pages(host_k, host_v, dev_k, dev_v, torch.tensor([[2, 4], [0, 0]]))
    assert torch.equal(dev_k[[4, 0]], original[0]) and torch.equal(dev_v[[4, 0]], original[1])


def test_long_partitioned_contexts_with_large_pages_match_reference():
    case = make_case(
        [1000, 700, 1, 300, 513], [1, 1, 1, 60, 1], page_size=128, num_heads=8, head_dim=32
    )
    out, expected = _both(case, _triton(partition_size=256))
    assert max_relative_error(out, expected) < TOL


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_kernels_on_cuda_match_reference_in_fp16_and_bf16():
    result = run_without_interpreter("triton_cuda_check.py")
    assert result.returncode == 0, result.stdout + result.stderr
