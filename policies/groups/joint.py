"""One allocation across KV-cache groups: the pages each group takes, checked and taken together
as one block of the pool, then shared out.

Each group asks for its pages (`pages_to_start`, `pages_to_grow`): a full-attention group the
allocation policy's block (a contiguous region by its reservation rule, a buddy block, a
geometric block), a sliding-window, chunked or state group the pages it needs, one per page of
tokens (a window holds a bounded number of pages, so growing blocks and reservations buy it
nothing). The sum is one block of the pool: under paging, exactly what the groups would take
one after another; under contiguous allocation, one region holding every group's share; under
buddy allocation, one power-of-two block, the rounding left to the first full-attention group
(it fills it later). So whether an allocation fits is one question to the pool, and an
allocation that does not fit changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.policies.page_pool import PagePool


@dataclass(slots=True)
class JointPlan:
    """What an allocation across groups takes, decided before anything changes."""

    hits: list[list[int]]  # a new request's hit table in each group; [] for a held one
    adds: list[int]  # pages each group takes (a copy-on-write page first)
    # Alone in buddy memory: the pages as power-of-two runs, not one block (a request alone
    # must always fit, `FullAttentionManager.plan_new`).
    as_runs: bool = False


def take_shares(pool: PagePool, plan: JointPlan, rounding_group: int) -> list[list[int]]:
    """Take the plan's pages as one block (or runs) and share them out in group order; pages
    the allocator rounds the block up by go to `rounding_group`."""
    total = sum(plan.adds)
    if not total:
        return [[] for _ in plan.adds]
    block = pool.take_runs(total) if plan.as_runs else pool.take_block(total)
    shares, start = [], 0
    for group, num_pages in enumerate(plan.adds):
        if group == rounding_group:
            num_pages += len(block) - total
        shares.append(block[start : start + num_pages])
        start += num_pages
    return shares
