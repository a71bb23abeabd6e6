"""Block-sizing policies: how many pages the next block of a sequence takes (protocol:
`interfaces.BlockSizing`).

`pages_for_next_block(seq, num_blocks, num_pages_needed)` returns at least `num_pages_needed`;
`num_blocks` is how many blocks the sequence already holds.
"""

from __future__ import annotations

from kvlab.policies.block_sizing import fixed, geometric, predicted  # noqa: F401  (registers them)
