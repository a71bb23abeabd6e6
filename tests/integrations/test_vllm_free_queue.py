"""PolicyFreeBlockQueue: vLLM's free block queue ordered by a kvlab eviction policy. (Against
vLLM's own BlockPool it runs in tests/peer/test_peer_vllm_plugin.py; here, on records with
the fields of vLLM's KVCacheBlock that it reads.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvlab.integrations.vllm.free_queue import PolicyFreeBlockQueue
from kvlab.policies.eviction.lfu import LFUEviction
from kvlab.policies.eviction.lru import LRUEviction

BLOCK = 16


@dataclass
class Block:
    """The fields of vLLM's KVCacheBlock the queue reads."""

    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None
    is_null: bool = False


def pool(num_blocks: int, evictor) -> tuple[list[Block], PolicyFreeBlockQueue]:
    blocks = [Block(i, is_null=i == 0) for i in range(num_blocks)]
    return blocks, PolicyFreeBlockQueue(blocks, blocks[1:], evictor, BLOCK)


def cache(blocks: list[Block], *ids: int) -> list[Block]:
    """Give blocks content (depth = their order), as vLLM's cache_full_blocks does."""
    for depth, block_id in enumerate(ids):
        blocks[block_id].block_hash = b"h%d" % block_id
        blocks[block_id].block_hash_num_tokens = (depth + 1) * BLOCK
    return [blocks[i] for i in ids]


def test_free_blocks_go_first_in_order_then_the_policys_victims():
    blocks, queue = pool(6, LRUEviction())
    assert [b.block_id for b in queue.popleft_n(3)] == [1, 2, 3]
    queue.append_n(list(reversed(cache(blocks, 1, 2))))  # a request's tail first, as vLLM
    assert queue.num_free_blocks == 4
    assert [b.block_id for b in queue.popleft_n(4)] == [4, 5, 2, 1]


def test_victims_follow_the_policy_not_the_release_order():
    blocks, queue = pool(4, LFUEviction())
    queue.popleft_n(3)
    queue.append_n(cache(blocks, 1, 2, 3))
    hit = blocks[1]
    queue.remove(hit)  # a prefix hit takes block 1 back
    queue.on_hits([hit])
    queue.append_n([hit])  # and releases it: one hit, so LFU keeps it longest
    assert [b.block_id for b in queue.popleft_n(3)] == [2, 3, 1]


def test_blocks_without_content_are_reused_first_and_last_resort_ones_last():
    blocks, queue = pool(5, LRUEviction())
    queue.popleft_n(4)
    queue.append_n(cache(blocks, 1))
    queue.append_n([blocks[2]])  # released with no content (vLLM's unpin_blocks)
    queue.prepend_n([blocks[3], blocks[4]])
    assert [b.block_id for b in queue.popleft_n(4)] == [3, 4, 1, 2]
    with pytest.raises(ValueError, match="No free blocks"):
        queue.popleft()


def test_removing_a_block_not_in_the_queue_is_an_error():
    _, queue = pool(3, LRUEviction())
    taken = queue.popleft()
    with pytest.raises(RuntimeError, match="not in the free queue"):
        queue.remove(taken)


def test_hits_on_the_null_block_are_not_told_to_the_policy():
    blocks, queue = pool(3, LFUEviction())
    queue.on_hits([blocks[0]])
    assert queue.evictor._hits == {}
