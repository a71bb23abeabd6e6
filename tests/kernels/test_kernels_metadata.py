"""AttentionMetadata.build: slot mapping, padding and the checks on its inputs."""

import pytest

from kvlab.kernels import AttentionMetadata


def _build(**overrides):
    args = dict(block_tables=[[7, 3], [2], [4, 0, 5]], seq_lens=[5, 2, 9], query_lens=[5, 1, 2])
    args.update(overrides)
    return AttentionMetadata.build(page_size=4, **args)


def test_slot_mapping_follows_each_block_table_in_token_order():
    # seq 0 positions 0..4 -> pages 7,7,7,7,3; seq 1 position 1 -> page 2; seq 2 positions 7, 8
    assert _build().slot_mapping.tolist() == [28, 29, 30, 31, 12, 9, 3, 20]


def test_block_tables_are_padded_with_page_zero():
    assert _build().block_tables.tolist() == [[7, 3, 0], [2, 0, 0], [4, 0, 5]]


def test_query_start_loc_is_the_cumulative_query_length():
    meta = _build()
    assert meta.query_start_loc.tolist() == [0, 5, 6, 8] == meta.query_start_loc_cpu


def test_host_lengths_and_maxima_match_the_inputs():
    meta = _build()
    assert (meta.seq_lens_cpu, meta.query_lens_cpu) == ([5, 2, 9], [5, 1, 2])
    assert (meta.max_seq_len, meta.max_query_len, meta.num_tokens) == (9, 5, 8)
    assert not meta.is_decode_only


def test_build_rejects_a_block_table_too_short_for_its_context():
    with pytest.raises(ValueError, match="sequence 1: 1 pages of 4 slots cannot hold seq_len 5"):
        _build(seq_lens=[5, 5, 9])


def test_build_rejects_a_query_longer_than_its_context():
    with pytest.raises(ValueError, match="sequence 0: query_len 6 with seq_len 5"):
        _build(query_lens=[6, 1, 2])
