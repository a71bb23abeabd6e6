"""Predicted block size: the first block covers the predicted length, later ones a page each."""

from __future__ import annotations

from kvlab.policies.registry import register
from kvlab.policies.request import Request


@register(
    "block_sizing",
    "predicted",
    help="first block sized to prompt + predicted output (oracle: the output budget)",
)
class PredictedBlockSizing:
    """Sizes the first block from a length predictor; here the oracle bound, `max_output_tokens`.

    In the simulator the output budget is the trace's real output length, so this is the oracle;
    in the engine a request may stop early at eos and leave the rest of its block unused.
    """

    __slots__ = ("page_size",)
    exact = False

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    def pages_for_next_block(self, seq: Request, num_blocks: int, num_pages_needed: int) -> int:
        """The whole predicted length on the first block, then exactly what is needed."""
        if num_blocks:
            return num_pages_needed
        predicted_pages = -(-seq.total_len // self.page_size)
        return max(num_pages_needed, predicted_pages)
