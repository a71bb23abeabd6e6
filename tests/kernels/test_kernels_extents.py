"""Extent tables: block tables as runs of contiguous pages, built with tensor ops."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from kvlab.kernels.extents import build_extents, extents_of


def _as_lists(table, seq):
    count = int(table.num_extents[seq])
    return list(
        zip(
            table.start_pages[seq, :count].tolist(),
            table.num_pages[seq, :count].tolist(),
            strict=True,
        )
    )


def test_runs_of_contiguous_pages_become_one_extent_each():
    tables = torch.tensor([[4, 5, 6, 7, 0, 1, 9, 0], [3, 2, 1, 0, 0, 0, 0, 0]], dtype=torch.int32)
    extents = build_extents(tables, torch.tensor([7 * 16, 4 * 16 - 3]), page_size=16)
    assert _as_lists(extents, 0) == [(4, 4), (0, 2), (9, 1)]
    assert _as_lists(extents, 1) == [(3, 1), (2, 1), (1, 1), (0, 1)]


def test_has_runs_tells_runs_from_single_pages():
    seq_lens = torch.tensor([40, 40])
    single = build_extents(torch.tensor([[3, 1, 7], [0, 2, 4]], dtype=torch.int32), seq_lens, 16)
    runs = build_extents(torch.tensor([[3, 1, 7], [4, 5, 9]], dtype=torch.int32), seq_lens, 16)
    assert not single.has_runs() and runs.has_runs()


def test_padding_past_the_context_is_not_an_extent():
    # the padding page 0 after page 7 would extend nothing, but page 8 after 7 would
    tables = torch.tensor([[6, 7, 8, 9]], dtype=torch.int32)
    extents = build_extents(tables, torch.tensor([17]), page_size=16)
    assert _as_lists(extents, 0) == [(6, 2)]


@given(
    st.lists(
        st.lists(st.integers(0, 12), min_size=1, max_size=10).flatmap(
            lambda table: st.tuples(st.just(table), st.integers(1, len(table) * 8))
        ),
        min_size=1,
        max_size=5,
    )
)
def test_extents_match_the_host_runs_of_every_block_table(seqs):
    page_size = 8
    width = max(len(table) for table, _ in seqs)
    tables = torch.tensor([t + [0] * (width - len(t)) for t, _ in seqs], dtype=torch.int32)
    seq_lens = torch.tensor([n for _, n in seqs])
    extents = build_extents(tables, seq_lens, page_size)
    for i, (table, seq_len) in enumerate(seqs):
        runs = extents_of(table, -(-seq_len // page_size))
        assert _as_lists(extents, i) == runs
        assert sum(n for _, n in runs) == -(-seq_len // page_size)
