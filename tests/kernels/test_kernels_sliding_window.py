"""Sliding-window paged attention (torch and Triton backends) against a dense masked reference,
with the pages behind each window given back: NULL_PAGE in the block table, NaN in the cache."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import PagedCase, contiguous_attention, make_case, max_relative_error

from kvlab.kernels import AttentionMetadata, get_backend
from kvlab.kernels.metadata import NULL_PAGE
from kvlab.specs.kv_groups import NULL_PAGE as MANAGER_NULL_PAGE
from kvlab.specs.kv_groups import KVCacheGroup

TOL = 1e-5  # fp32 relative error


def _triton(**kwargs):
    from kvlab.kernels.triton_backend import TritonBackend

    return TritonBackend(**kwargs)


def _backends():
    return [
        pytest.param(lambda: get_backend("torch"), id="torch"),
        pytest.param(_triton, id="triton", marks=pytest.mark.skipif(
            not _has_triton(), reason="needs triton")),
    ]


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def give_back_behind_window(case: PagedCase, window: int) -> list[list[int]]:
    """As a sliding-window KV manager would: every page no query row of this step attends to
    becomes NULL_PAGE in the table, and its slots turn NaN (a reused page's garbage)."""
    group = KVCacheGroup("sliding_window", window=window)
    page_size = case.meta.page_size
    tables = []
    for seq_id, table in enumerate(case.meta.block_tables.tolist()):
        seq_len, query_len = case.meta.seq_lens_cpu[seq_id], case.meta.query_lens_cpu[seq_id]
        table = table[: -(-seq_len // page_size)]
        skipped = group.num_skipped_tokens(seq_len - query_len)
        for index in range(skipped // page_size):
            case.k_cache[table[index]] = float("nan")
            case.v_cache[table[index]] = float("nan")
            table[index] = NULL_PAGE
        tables.append(table)
    case.meta = case.meta.with_block_tables(tables)
    return tables


def _attention(backend, case: PagedCase, window: int) -> torch.Tensor:
    out = torch.full_like(case.query, float("nan"))
    backend.paged_attention(
        case.query, case.k_cache, case.v_cache, case.meta, scale=case.scale,
        num_kv_heads=case.num_kv_heads, out=out, sliding_window=window,
    )
    return out


def test_null_page_is_the_managers():
    assert NULL_PAGE == MANAGER_NULL_PAGE == -1


@pytest.mark.parametrize("make_backend", _backends())
@pytest.mark.parametrize(("page_size", "window"), [(4, 1), (4, 8), (4, 13), (16, 5), (16, 40)])
def test_mixed_batch_with_pages_given_back_matches_dense_masked_reference(
    make_backend, page_size, window
):
    # a whole prefill, a chunk after a prefix, a first token, decodes short and long
    case = make_case([30, 45, 1, 9, 70], [30, 12, 1, 1, 1], page_size=page_size, seed=window)
    tables = give_back_behind_window(case, window)
    if window < 30:
        assert any(NULL_PAGE in table for table in tables)  # the case exercises NULL_PAGE
    out = _attention(make_backend(), case, window)
    assert max_relative_error(out, contiguous_attention(case, window)) < TOL


@pytest.mark.parametrize("make_backend", _backends())
def test_null_page_read_as_page_zero_is_masked(make_backend):
    # unshuffled: page 0 is the first page of sequence 0, behind its window and NaN
    case = make_case([20, 11], [1, 3], page_size=4, shuffle=False)
    tables = give_back_behind_window(case, 6)
    assert tables[0][0] == NULL_PAGE and torch.isnan(case.k_cache[0]).all()
    out = _attention(make_backend(), case, 6)
    assert max_relative_error(out, contiguous_attention(case, 6)) < TOL


@pytest.mark.parametrize("make_backend", _backends())
def test_window_as_long_as_the_context_is_full_attention(make_backend):
    case = make_case([17, 6], [17, 1], page_size=4)
    backend = make_backend()
    windowed = _attention(backend, case, 17)
    full = _attention(backend, case, 0)
    assert max_relative_error(windowed, full) < TOL


def test_triton_partitioned_decode_over_a_window_matches_reference():
    # windows below, at and across the 64-token partition; contexts far longer than them
    for window in (40, 64, 100):
        case = make_case([200, 129, 70], [1, 1, 1], page_size=16, seed=window)
        give_back_behind_window(case, window)
        out = _attention(_triton(partition_size=64), case, window)
        assert max_relative_error(out, contiguous_attention(case, window)) < TOL, window


def test_triton_prefill_rows_whose_first_tiles_are_all_behind_their_window():
    # 150 query rows in three 64-row blocks, window 8: a block's late rows see nothing in the
    # tiles its early rows start from
    case = make_case([150], [150], page_size=16, num_heads=2, num_kv_heads=1)
    out = _attention(_triton(), case, 8)
    assert max_relative_error(out, contiguous_attention(case, 8)) < TOL


def test_metadata_refuses_a_null_page_where_a_new_token_goes():
    with pytest.raises(ValueError, match="NULL_PAGE where new tokens 8"):
        AttentionMetadata.build(
            block_tables=[[NULL_PAGE, NULL_PAGE, NULL_PAGE]],
            seq_lens=[9],
            query_lens=[1],
            page_size=4,
        )
    with pytest.raises(ValueError, match="negative page id"):
        AttentionMetadata.build(
            block_tables=[[-2, 3]], seq_lens=[5], query_lens=[1], page_size=4
        )


def test_metadata_over_another_groups_tables_shares_the_batch():
    meta = AttentionMetadata.build(
        block_tables=[[3, 4, 5], [6]], seq_lens=[10, 2], query_lens=[2, 1], page_size=4
    )
    other = meta.with_block_tables([[NULL_PAGE, 1, 2], [7]])
    assert other.block_tables.tolist() == [[NULL_PAGE, 1, 2], [7, 0, 0]]
    assert other.slot_mapping.tolist() == [2 * 4 + 0, 2 * 4 + 1, 7 * 4 + 1]
    assert other.seq_lens is meta.seq_lens and other.query_start_loc is meta.query_start_loc
