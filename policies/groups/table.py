"""A sequence's block table in one KV-cache group, and an allocation's plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.policies.tiers import TierRuns


@dataclass(slots=True)
class SeqState:
    """A sequence's memory in one group: its block table and how far allocate() may go without
    the slow path."""

    pages: list[int]
    num_tokens: int  # token slots claimed: KV written, or being written this step
    fast_limit: int  # allocate() up to this many tokens is a counter update (O(1))
    num_blocks: int  # blocks taken so far (block-sizing policies grow with it)
    num_hashed: int  # leading pages registered in the prefix cache (or known to be there)
    hashes: list  # the prompt's page hashes (empty without prefix caching)
    # True while exactly pages[:num_hashed] are registered, each under its own page hash (no
    # fork, no page whose content was already cached elsewhere): releasing then needs no
    # lookup per page.
    regular: bool = True
    num_hit_pages: int = 0  # leading pages taken as prefix-cache hits at admission
    # True when output pages get hashes as they fill (token ids known, prefix caching on): the
    # fast path then stops where each page fills, so it is registered in the step that fills it.
    hash_outputs: bool = False
    # Leading entries given back (`NULL_PAGE`): pages no later token reads (windowed groups).
    num_null_pages: int = 0
    # A precision policy's record of the sequence (policies/precision/driver.py), None until
    # it first looks at it: kept here, not in a dict by request, so that a sequence admitted
    # again (a new state) starts a new one and every step's look at each costs no lookup.
    precision: Any = None


@dataclass(slots=True)
class Plan:
    """What an allocation will do, computed before anything changes."""

    hit_pages: list[int]
    num_block_pages: int  # pages asked of the allocator as one block (0: none)
    cow: bool  # the block's first page replaces the shared, partly filled last page
    # The pages as power-of-two runs, largest first, instead of one block: a request alone in
    # memory whose own blocks would not fit (see `FullAttentionManager.plan_new`).
    as_runs: bool = False
    # Prefix hits below the device, after `hit_pages`, as runs (level, tier slots): loaded
    # into the block's first pages.
    tier_hits: TierRuns | None = None
    # Pages after those whose KV another instance sends (`Request.kv_transfer_tokens`).
    num_transfer_pages: int = 0
    # The block's pages, taken already (a hybrid manager takes one block for every group and
    # hands each its share); None: taken from the pool here.
    block: list[int] | None = None
