"""Fixed block size: every block is exactly the pages needed now (one page per page boundary)."""

from __future__ import annotations

from kvlab.policies.registry import register
from kvlab.policies.request import Request


@register("block_sizing", "fixed", help="grow one page at a time, exactly as needed (vLLM)")
class FixedBlockSizing:
    """No look-ahead: a sequence holds ceil(tokens / page_size) pages."""

    __slots__ = ()
    exact = True

    def __init__(self, page_size: int) -> None:
        pass

    def pages_for_next_block(self, seq: Request, num_blocks: int, num_pages_needed: int) -> int:
        """Exactly what is needed."""
        return num_pages_needed
