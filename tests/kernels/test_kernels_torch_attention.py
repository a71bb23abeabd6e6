"""The torch reference paged attention against contiguous scaled_dot_product_attention."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import attend, contiguous_attention, make_case, max_relative_error

from kvlab.kernels import get_backend

TOL = 1e-5


def _run(case, out=None):
    return attend(case, get_backend("torch"), out)


@pytest.mark.parametrize("page_size", [1, 2, 16, 128])
def test_mixed_prefill_chunks_and_decodes_match_contiguous_attention(page_size):
    # a fresh prefill, a chunk after a cached prefix, and decodes of ragged lengths
    case = make_case([37, 150, 1, 9, 200], [37, 20, 1, 1, 1], page_size=page_size)
    assert max_relative_error(_run(case), contiguous_attention(case)) < TOL


def test_decode_only_batch_of_ragged_lengths_matches_contiguous_attention():
    case = make_case([1, 17, 64, 3, 129], [1] * 5, page_size=16)
    assert max_relative_error(_run(case), contiguous_attention(case)) < TOL


def test_decode_groups_split_by_gather_bound_match_contiguous_attention(monkeypatch):
    monkeypatch.setattr("kvlab.kernels.torch_backend._MAX_DECODE_GROUP_SLOTS", 64)
    case = make_case([5, 40, 33, 70, 2, 64], [1] * 6, page_size=16)
    assert max_relative_error(_run(case), contiguous_attention(case)) < TOL


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (6, 1)])
def test_grouped_query_heads_read_their_own_kv_head(num_heads, num_kv_heads):
    case = make_case([30, 12], [7, 1], page_size=4, num_heads=num_heads, num_kv_heads=num_kv_heads)
    assert max_relative_error(_run(case), contiguous_attention(case)) < TOL


def test_block_table_order_not_page_order_decides_token_order():
    shuffled = make_case([50, 20], [10, 1], page_size=4, shuffle=True, seed=3)
    in_order = make_case([50, 20], [10, 1], page_size=4, shuffle=False, seed=3)
    assert shuffled.meta.block_tables.tolist() != in_order.meta.block_tables.tolist()
    torch.testing.assert_close(_run(shuffled), _run(in_order), rtol=0, atol=1e-6)


def test_result_is_written_into_the_given_output_buffer():
    case = make_case([10, 5], [3, 1], page_size=4)
    out = torch.full_like(case.query, float("nan"))
    result = _run(case, out=out)
    assert result is out
    assert max_relative_error(out, contiguous_attention(case)) < TOL


def test_bf16_inputs_give_bf16_output_close_to_fp32_attention():
    case = make_case([40, 9], [40, 1], page_size=16, dtype=torch.bfloat16)
    result = _run(case)
    assert result.dtype == torch.bfloat16
    assert max_relative_error(result, contiguous_attention(case)) < 1e-2


@settings(max_examples=25, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(1, 70), st.integers(0, 70)), min_size=1, max_size=5),
    page_size=st.sampled_from([1, 2, 3, 16]),
    seed=st.integers(0, 2**16),
)
def test_any_ragged_batch_matches_contiguous_attention(data, page_size, seed):
    seq_lens = [s for s, _ in data]
    query_lens = [min(q, s) or 1 for s, q in data]
    case = make_case(seq_lens, query_lens, page_size=page_size, seed=seed)
    assert max_relative_error(_run(case), contiguous_attention(case)) < TOL
