"""Put kvlab's eviction policy into vLLM's device block pool: `BlockPool.__init__` gets a
`PolicyFreeBlockQueue`, `touch` tells it of every prefix hit, and a successful
`reset_prefix_cache` starts it afresh (a fresh policy, free blocks in id order: the pool of a
new server, as kvlab's replay starts)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from kvlab.integrations.vllm.free_queue import PolicyFreeBlockQueue
from kvlab.policies.interfaces import Eviction

logger = logging.getLogger("vllm.kvlab")


def install(block_pool_cls: Any, policy: Callable[[], Eviction], spec: str,
            device_medium: str) -> None:
    """Patch `block_pool_cls` (vLLM's BlockPool) so that every pool of `device_medium` with
    prefix caching evicts by a new `policy()`; other pools (CPU offload pools) keep vLLM's
    queue. Idempotent."""
    if getattr(block_pool_cls, "_kvlab_eviction", None) is not None:
        return
    init, touch, reset = (block_pool_cls.__init__, block_pool_cls.touch,
                          block_pool_cls.reset_prefix_cache)

    def fresh_queue(pool: Any) -> PolicyFreeBlockQueue:
        free = sorted((b for b in pool.blocks if not b.is_null and b.ref_cnt == 0),
                      key=lambda b: b.block_id)
        return PolicyFreeBlockQueue(pool.blocks, free, policy(), pool.hash_block_size)

    @functools.wraps(init)
    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self.enable_caching and self.medium == device_medium:
            self.free_block_queue = fresh_queue(self)
            logger.info("kvlab: vLLM's device prefix cache (%d blocks) evicts by kvlab's %s",
                        self.num_gpu_blocks - 1, spec)

    @functools.wraps(touch)
    def patched_touch(self: Any, blocks: Any) -> None:
        touch(self, blocks)
        queue = self.free_block_queue
        if isinstance(queue, PolicyFreeBlockQueue):
            queue.on_hits(blocks)

    @functools.wraps(reset)
    def patched_reset(self: Any) -> bool:
        done: bool = reset(self)
        if done and isinstance(self.free_block_queue, PolicyFreeBlockQueue):
            self.free_block_queue = fresh_queue(self)
        return done

    block_pool_cls.__init__ = patched_init
    block_pool_cls.touch = patched_touch
    block_pool_cls.reset_prefix_cache = patched_reset
    block_pool_cls._kvlab_eviction = spec
