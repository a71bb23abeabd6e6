"""vLLM's free block queue, ordered by a kvlab eviction policy.

vLLM's `BlockPool` keeps every block without an owner in one `FreeKVCacheBlockQueue`: blocks
that hold no prefix at its front (popped first), cached blocks behind them in LRU order, and
allocation pops from the front, evicting a cached block's content as it goes. This class keeps
the same interface (`popleft`, `popleft_n`, `remove`, `append`, `append_n`, `prepend_n`,
`num_free_blocks`) with the cached blocks held by a kvlab `Eviction` policy instead: blocks
with no prefix first, then the policy's victims in its order, then blocks released as last
resort with no prefix (vLLM's `unpin_blocks`). The policy sees the calls kvlab's page pool
makes (`kvlab.policies.page_pool`): `add` when a cached block loses its last owner (tail first,
as vLLM frees them), `remove` then `on_hit` when a prefix hit takes it (`on_hits`, called by the
patched `BlockPool.touch`), `pop_victim` when the allocator needs it.

A block's page id for the policy is its block id less one: vLLM's block 0 is the null block,
never free, so vLLM's blocks 1..N-1 are kvlab's pages 0..N-2, as in kvlab's replay of the same
server (which counts N - 1 pages).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from kvlab.policies.interfaces import Eviction, add_cached, pop_victims

PAGE_OFFSET = 1  # vLLM's null block is block 0


class PolicyFreeBlockQueue:
    """`FreeKVCacheBlockQueue`'s interface over `evictor` (a kvlab eviction policy).

    `blocks`: the pool's blocks (block id -> block); `free`: the free blocks, front first;
    `block_size`: tokens per block (a cached block's depth in its request is its hashed tokens
    over this, less one).
    """

    __slots__ = ("_blocks", "_free", "_last", "block_size", "evictor")

    def __init__(self, blocks: Sequence[Any], free: Iterable[Any], evictor: Eviction,
                 block_size: int) -> None:
        self._blocks = blocks
        self.evictor = evictor
        self.block_size = block_size
        self._free: OrderedDict[int, Any] = OrderedDict()  # no prefix: popped first
        self._last: OrderedDict[int, Any] = OrderedDict()  # no prefix, released last resort
        for block in free:
            self._take_in(block, front=False)

    @property
    def num_free_blocks(self) -> int:
        """Blocks without an owner: free, cached-free and last-resort ones."""
        return len(self._free) + len(self.evictor) + len(self._last)

    def popleft(self) -> Any:
        """The next block to reuse. Raises ValueError when none is free (as vLLM's)."""
        if not self.num_free_blocks:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[Any]:
        """The next `n` blocks to reuse: free ones, then the policy's victims in its order,
        then last-resort ones. The caller drops a victim's cached content (vLLM's
        `_maybe_evict_cached_block`)."""
        assert n <= self.num_free_blocks, (n, self.num_free_blocks)
        taken = [self._free.popitem(last=False)[1] for _ in range(min(n, len(self._free)))]
        num_victims = min(n - len(taken), len(self.evictor))
        if num_victims:
            pages, _ = pop_victims(self.evictor, num_victims)
            taken += [self._blocks[page + PAGE_OFFSET] for page in pages]
        while len(taken) < n:
            taken.append(self._last.popitem(last=False)[1])
        return taken

    def remove(self, block: Any) -> None:
        """Take a block out of the queue (a prefix hit on a cached-free block). Raises
        RuntimeError when it is not in the queue (as vLLM's)."""
        block_id = block.block_id
        page = block_id - PAGE_OFFSET
        if page in self.evictor:
            self.evictor.remove(page)
        elif self._free.pop(block_id, None) is None and self._last.pop(block_id, None) is None:
            raise RuntimeError(f"remove() called on a block not in the free queue: {block_id}")

    def on_hits(self, blocks: Iterable[Any]) -> None:
        """Every block of a prefix hit (taken from the queue or held by other requests)."""
        evictor = self.evictor
        for block in blocks:
            if not block.is_null:
                evictor.on_hit(block.block_id - PAGE_OFFSET)

    def append(self, block: Any) -> None:
        """`append_n([block])`."""
        self.append_n([block])

    def append_n(self, blocks: list[Any]) -> None:
        """Blocks that lost their last owner, in vLLM's eviction order (a request's tail
        first): those holding a prefix go to the policy, the others last resort."""
        cached = [block for block in blocks if block.block_hash is not None]
        if cached:
            size = self.block_size
            add_cached(self.evictor, [block.block_id - PAGE_OFFSET for block in cached],
                       [block.block_hash for block in cached],
                       [max(0, (block.block_hash_num_tokens or size) // size - 1)
                        for block in cached])
        for block in blocks:
            if block.block_hash is None:
                self._last[block.block_id] = block

    def prepend_n(self, blocks: list[Any]) -> None:
        """Blocks with no prefix, reused first (the first of `blocks` first)."""
        for block in reversed(blocks):
            self._take_in(block, front=True)

    def get_all_free_blocks(self) -> list[Any]:
        """Every block in the queue: free ones in order, the policy's (in its `pages()`
        order, which is not its eviction order for every policy), last-resort ones."""
        cached = [self._blocks[page + PAGE_OFFSET] for page in self.evictor.pages()]
        return [*self._free.values(), *cached, *self._last.values()]

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        """The blocks of `get_all_free_blocks` after `cursor` (vLLM's simple CPU offload walks
        the queue with it; its order is approximate here, see `get_all_free_blocks`)."""
        blocks = self.get_all_free_blocks()
        start = 0
        if cursor is not None:
            ids = [block.block_id for block in blocks]
            start = ids.index(cursor.block_id) + 1 if cursor.block_id in ids else 0
        yield from blocks[start:]

    def _take_in(self, block: Any, *, front: bool) -> None:
        """A free block with no owner: to the policy when it holds a prefix (a pool built
        warm), else to the free blocks' front or back."""
        if block.block_hash is not None:
            self.append_n([block])
            return
        self._free[block.block_id] = block
        if front:
            self._free.move_to_end(block.block_id, last=False)
