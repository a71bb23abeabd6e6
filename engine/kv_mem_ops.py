"""MemOps carried out on the KV cache's tensors: a step's host-tier writes, swap-outs, copies,
swap-ins and host-tier loads, in that order, through the kvlab.kernels backend that moves
pages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kvlab.policies.outputs import MemOps, TierBatch

if TYPE_CHECKING:
    from kvlab.engine.kv_cache import KVCache


def copy_batches(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Split ordered (src, dst) copies into batches a gather-then-scatter kernel runs correctly.

    Within a batch no copy reads or rewrites a page an earlier copy of that batch wrote, so each
    batch at once equals its copies one by one in list order (copies may chain: a->b, b->c).
    """
    batches: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    written: set[int] = set()
    for src, dst in pairs:
        if src in written or dst in written:
            batches.append(current)
            current, written = [], set()
        current.append((src, dst))
        written.add(dst)
    if current:
        batches.append(current)
    return batches


def execute_mem_ops(cache: KVCache, mem_ops: MemOps) -> None:
    """Carry out a step's memory work on `cache` in MemOps' order: host-tier writes,
    swap-outs, copies, swap-ins, then host-tier loads.

    Tier writes read device pages this step may overwrite, so they go first; a device page
    freed by a swap-out may be the destination of a copy, a swap-in or a tier load in the
    same step, so swap-outs go before those; copies run as if one by one in list order.
    With mixed-precision pages, requantizations run first and the page levels are
    brought up to date last (engine/precision_pages.py).
    """
    precision, backend = cache.precision, cache.backend
    if precision is not None:
        precision.before_mem_ops(mem_ops)
    for write in mem_ops.tier_writes:  # batch after batch: a later one may reuse a page
        _move(backend, write, cache.k_caches, cache.v_caches, cache.tier_k_caches,
              cache.tier_v_caches)
    if mem_ops.swap_outs:
        pairs = torch.tensor(mem_ops.swap_outs, dtype=torch.long)
        for layer in range(len(cache.k_caches)):
            backend.swap_pages(cache.k_caches[layer], cache.v_caches[layer],
                               cache.host_k_caches[layer], cache.host_v_caches[layer], pairs)
    for batch in copy_batches(mem_ops.copies):
        pairs = torch.tensor(batch, dtype=torch.long, device=cache.k_caches[0].device)
        for k_cache, v_cache in zip(cache.k_caches, cache.v_caches, strict=True):
            backend.copy_pages(k_cache, v_cache, pairs)
    if mem_ops.swap_ins:
        pairs = torch.tensor(mem_ops.swap_ins, dtype=torch.long)
        for layer in range(len(cache.k_caches)):
            backend.swap_pages(cache.host_k_caches[layer], cache.host_v_caches[layer],
                               cache.k_caches[layer], cache.v_caches[layer], pairs)
    for load in mem_ops.tier_loads:
        _move(backend, load, cache.tier_k_caches, cache.tier_v_caches, cache.k_caches,
              cache.v_caches)
    if precision is not None:
        precision.after_mem_ops()


def _move(backend: Any, batch: TierBatch, src_k: list[torch.Tensor], src_v: list[torch.Tensor],
          dst_k: list[torch.Tensor], dst_v: list[torch.Tensor]) -> None:
    """Copy a batch of pages from one memory to another, every layer (one gather, one
    transfer, one scatter: its destinations are distinct)."""
    table = torch.tensor([list(batch.src_pages), list(batch.dst_pages)], dtype=torch.long).T
    for layer in range(len(src_k)):
        backend.swap_pages(src_k[layer], src_v[layer], dst_k[layer], dst_v[layer], table)
