"""Extent tables: each sequence's block table as runs of contiguous pages.

A dynamic-block-size policy hands a sequence runs of 2^k contiguous pages, and a contiguous
policy one long run. An attention kernel that reads a run as one address range moves its K/V
with a few long DMA transfers instead of one gather per page; on Ascend's vector cores, whose
discrete loads are scalar, that is the difference that matters. Fixed-size paging gives one
extent per page (unless the free list happens to hand out neighbours), so the same kernel serves
every policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class ExtentTable:
    """Runs of contiguous pages per sequence, padded with zeros.

    `start_pages[i, e]` is the first page of extent e of sequence i, `num_pages[i, e]` its length
    in pages, `num_extents[i]` how many extents sequence i has. All int32, on the block table's
    device. Extents cover exactly the pages that hold the sequence's `seq_len` tokens.
    """

    start_pages: Tensor
    num_pages: Tensor
    num_extents: Tensor

    def has_runs(self) -> bool:
        """True when some extent is longer than one page (one host sync)."""
        return bool((self.num_pages > 1).any())


def build_extents(block_tables: Tensor, seq_lens: Tensor, page_size: int) -> ExtentTable:
    """The extent table of `block_tables [num_seqs, max_pages]` for contexts of `seq_lens`.

    Runs on the tables' device with tensor ops only (no per-sequence loop, no host sync): the
    tables are as wide as the block tables, whose width bounds any sequence's extent count.
    """
    num_seqs, max_pages = block_tables.shape
    device = block_tables.device
    tables = block_tables.to(torch.int64)
    used = (seq_lens.to(torch.int64) + page_size - 1) // page_size  # pages holding context
    col = torch.arange(max_pages, device=device)
    valid = col[None, :] < used[:, None]
    follows = torch.zeros_like(valid)
    if max_pages > 1:
        follows[:, 1:] = tables[:, 1:] == tables[:, :-1] + 1
    starts = valid & ~follows
    extent_id = torch.cumsum(starts.to(torch.int64), dim=1) - 1  # extent each page belongs to
    num_extents = starts.sum(dim=1)
    width = max(max_pages, 1)
    start_pages = torch.zeros(num_seqs, width, dtype=torch.int64, device=device)
    lengths = torch.zeros(num_seqs, width, dtype=torch.int64, device=device)
    rows = torch.arange(num_seqs, device=device)[:, None].expand(num_seqs, max_pages)
    start_pages[rows[starts], extent_id[starts]] = tables[starts]
    lengths.index_put_(
        (rows[valid], extent_id[valid]), torch.ones_like(tables[valid]), accumulate=True
    )
    return ExtentTable(
        start_pages=start_pages.to(torch.int32),
        num_pages=lengths.to(torch.int32),
        num_extents=num_extents.to(torch.int32),
    )


def extents_of(block_table: list[int], num_pages: int) -> list[tuple[int, int]]:
    """(first page, pages) runs of the first `num_pages` pages of one host block table."""
    runs: list[tuple[int, int]] = []
    for page in block_table[:num_pages]:
        if runs and page == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((page, 1))
    return runs
