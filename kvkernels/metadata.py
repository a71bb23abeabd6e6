"""The per-step description of a batch that every attention backend reads."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate

import torch
from torch import Tensor

from kvlab.specs.kv_groups import NULL_PAGE  # (a given-back entry: never read)


@dataclass(slots=True)
class AttentionMetadata:
    """Describes one mixed batch (prefill chunks and decodes) over block tables.

    Sequence i owns query rows `query_start_loc[i]:query_start_loc[i + 1]`; they are the LAST
    `query_lens_cpu[i]` tokens of its context of `seq_lens_cpu[i]` tokens, so query row j of
    sequence i sits at position `seq_len - query_len + j` and attends causally to positions
    <= its own. Device tensors: `slot_mapping` int64 (-1 = do not write), `block_tables`,
    `seq_lens` and `query_start_loc` int32; `block_tables` is padded with page 0. A block
    table may hold NULL_PAGE (-1) for pages wholly behind a layer's sliding window; no new token
    may fall in one, and backends never read one.
    """

    slot_mapping: Tensor
    block_tables: Tensor
    seq_lens: Tensor
    query_start_loc: Tensor
    seq_lens_cpu: list[int]
    query_lens_cpu: list[int]
    max_seq_len: int
    max_query_len: int
    page_size: int

    @classmethod
    def build(
        cls,
        *,
        block_tables: list[list[int]],
        seq_lens: list[int],
        query_lens: list[int],
        page_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Metadata for a batch from host lists; computes the slot of every new token.

        Raises ValueError when the lists disagree (a caller bug): lengths differ, a query is
        empty or longer than its context, or a block table is too short for its context.
        """
        _check_batch(block_tables, seq_lens, query_lens, page_size)
        tables = _pad_tables(block_tables)
        slots = _slot_mapping(tables, seq_lens, query_lens, page_size)
        return cls(
            slot_mapping=slots.to(device),
            block_tables=tables.to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(
                [0, *accumulate(query_lens)], dtype=torch.int32, device=device
            ),
            seq_lens_cpu=list(seq_lens),
            query_lens_cpu=list(query_lens),
            max_seq_len=max(seq_lens, default=0),
            max_query_len=max(query_lens, default=0),
            page_size=page_size,
        )

    def with_block_tables(self, block_tables: list[list[int]]) -> AttentionMetadata:
        """The same batch over other block tables (another KV-cache group's): new
        `block_tables` and `slot_mapping`, every other field shared."""
        _check_batch(block_tables, self.seq_lens_cpu, self.query_lens_cpu, self.page_size)
        tables = _pad_tables(block_tables)
        slots = _slot_mapping(tables, self.seq_lens_cpu, self.query_lens_cpu, self.page_size)
        device = self.block_tables.device
        return replace(self, slot_mapping=slots.to(device), block_tables=tables.to(device))

    @property
    def num_seqs(self) -> int:
        """Sequences in the batch."""
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        """New (query) tokens in the batch: the rows of query, key and value."""
        return sum(self.query_lens_cpu)

    @property
    def query_start_loc_cpu(self) -> list[int]:
        """Host copy of query_start_loc: cumulative query lengths, starting at 0."""
        return [0, *accumulate(self.query_lens_cpu)]

    @property
    def is_decode_only(self) -> bool:
        """True when every sequence computes exactly one new token."""
        return self.max_query_len == 1


def _check_batch(
    block_tables: list[list[int]], seq_lens: list[int], query_lens: list[int], page_size: int
) -> None:
    if page_size < 1:
        raise ValueError(f"page_size is {page_size}, expected a positive number of slots")
    if not len(block_tables) == len(seq_lens) == len(query_lens):
        raise ValueError(
            f"{len(block_tables)} block tables, {len(seq_lens)} seq_lens and {len(query_lens)} "
            "query_lens: expected one of each per sequence"
        )
    for i, (table, seq_len, query_len) in enumerate(
        zip(block_tables, seq_lens, query_lens, strict=True)
    ):
        if not 1 <= query_len <= seq_len:
            raise ValueError(
                f"sequence {i}: query_len {query_len} with seq_len {seq_len}, "
                "expected 1 <= query_len <= seq_len"
            )
        if len(table) * page_size < seq_len:
            raise ValueError(
                f"sequence {i}: {len(table)} pages of {page_size} slots cannot hold "
                f"seq_len {seq_len}"
            )
        if any(page_id < 0 for page_id in table):
            _check_null_pages(i, table, seq_len, query_len, page_size)


def _check_null_pages(
    seq_id: int, table: list[int], seq_len: int, query_len: int, page_size: int
) -> None:
    """NULL_PAGE entries only, and none where this step writes a new token."""
    if any(page_id < NULL_PAGE for page_id in table):
        raise ValueError(f"sequence {seq_id}: negative page id in block table {table}")
    first_written = (seq_len - query_len) // page_size
    if NULL_PAGE in table[first_written : -(-seq_len // page_size)]:
        raise ValueError(
            f"sequence {seq_id}: block table {table} has NULL_PAGE where new tokens "
            f"{seq_len - query_len}..{seq_len - 1} go"
        )


def _pad_tables(block_tables: list[list[int]]) -> Tensor:
    """Host int32 [num_seqs, max_pages] table, padded with page 0."""
    max_pages = max((len(table) for table in block_tables), default=0)
    padded = [table + [0] * (max_pages - len(table)) for table in block_tables]
    return torch.tensor(padded, dtype=torch.int32).reshape(len(block_tables), max_pages)


def _slot_mapping(
    tables: Tensor, seq_lens: list[int], query_lens: list[int], page_size: int
) -> Tensor:
    """Host int64 slot of every new token, in query-row order."""
    counts = torch.tensor(query_lens, dtype=torch.int64)
    seq_ids = torch.repeat_interleave(torch.arange(len(query_lens)), counts)
    row_starts = torch.tensor([0, *accumulate(query_lens)][:-1], dtype=torch.int64)
    first_positions = torch.tensor(seq_lens, dtype=torch.int64) - counts
    rows = torch.arange(int(counts.sum()))
    positions = rows - row_starts[seq_ids] + first_positions[seq_ids]
    pages = tables.to(torch.int64)[seq_ids, positions // page_size]
    return pages * page_size + positions % page_size
