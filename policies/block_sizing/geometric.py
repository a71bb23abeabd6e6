"""Geometric block size: the k-th block of a sequence has 2^k pages (capped)."""

from __future__ import annotations

from kvlab.policies.registry import register
from kvlab.policies.request import Request

MAX_BLOCK_PAGES = 64  # caps the slack a long sequence can hold in its last block


@register(
    "block_sizing",
    "geometric",
    help=f"k-th block takes 2^k pages (at most {MAX_BLOCK_PAGES}): fewer, larger blocks",
)
class GeometricBlockSizing:
    """Doubling blocks, like a growable array: O(log n) allocations per sequence."""

    __slots__ = ()
    exact = False

    def __init__(self, page_size: int) -> None:
        pass

    def pages_for_next_block(self, seq: Request, num_blocks: int, num_pages_needed: int) -> int:
        """2^num_blocks pages (capped), or what is needed if more."""
        return max(num_pages_needed, min(1 << num_blocks, MAX_BLOCK_PAGES))
