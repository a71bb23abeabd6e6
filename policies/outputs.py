"""What the manager and the scheduler hand to their executors (engine or simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvlab.policies.request import Request


class TierBatch(NamedTuple):
    """Pages copied between two memory levels (0 is the device, i the i-th tier), pairwise:
    `src_pages[j]` of `src_level` to `dst_pages[j]` of `dst_level`; no destination twice."""

    src_level: int
    src_pages: Sequence[int]  # a list, or a range for a row of tier pages
    dst_level: int
    dst_pages: Sequence[int]


@dataclass(slots=True)
class MemOps:
    """The physical work one memory decision implies; the executor carries it out.

    Each list holds (source page, destination page) pairs: `copies` are device-to-device copies
    (copy-on-write), `swap_outs` copy device pages to host pages, `swap_ins` host pages back to
    device pages. Executors carry them out before the step's forward pass, in this order:
    swap_outs, then copies, then swap_ins (a page freed by a swap-out may be the destination of a
    later copy or swap-in in the same step; a page copied on write in the step is swapped out
    from the copy's source, which still holds the content then). Dynamic block sizes need no
    page moves here: a block table addresses blocks wherever they lie. A transfer is one run of
    consecutive pages on both sides, which is what a link's per-transfer latency is charged on.

    Memory tiers (policies/tiers/) add two lists of `TierBatch`es: `tier_writes` (device
    pages stored to the first tier, tier pages moved down) run first of all, batch after batch
    in list order, while every source still holds its content; `tier_loads` (tier pages into
    fresh device pages of the prefix hits below the device) run last, and with them
    `transfer_ins`: the device pages that receive a request's KV from another instance
    (prefill/decode disaggregation: `Request.kv_transfer_tokens`).

    `requantize` (precision policies, policies/precision/) holds (device page, level before,
    level after) triples: the page's content rewritten in place at a lower precision (levels
    of the manager's `PrecisionLadder`; 0 is the cache's dtype). They run first of all, before
    anything reads or writes those pages in the step.
    """

    copies: list[tuple[int, int]] = field(default_factory=list)
    swap_outs: list[tuple[int, int]] = field(default_factory=list)
    swap_ins: list[tuple[int, int]] = field(default_factory=list)
    tier_writes: list[TierBatch] = field(default_factory=list)
    tier_loads: list[TierBatch] = field(default_factory=list)
    transfer_ins: list[int] = field(default_factory=list)
    requantize: list[tuple[int, int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.copies or self.swap_outs or self.swap_ins or self.tier_writes
                    or self.tier_loads or self.transfer_ins or self.requantize)

    def extend(self, other: MemOps) -> None:
        """Append another decision's work after this one's."""
        self.copies.extend(other.copies)
        self.swap_outs.extend(other.swap_outs)
        self.swap_ins.extend(other.swap_ins)
        self.tier_writes.extend(other.tier_writes)
        self.tier_loads.extend(other.tier_loads)
        self.transfer_ins.extend(other.transfer_ins)
        self.requantize.extend(other.requantize)

    @property
    def num_swap_out_transfers(self) -> int:
        """Separate device-to-host transfers: one per run of consecutive device and host pages."""
        return count_runs(self.swap_outs)

    @property
    def num_swap_in_transfers(self) -> int:
        """Separate host-to-device transfers: one per run of consecutive host and device pages."""
        return count_runs(self.swap_ins)


def count_runs(pairs: list[tuple[int, int]]) -> int:
    """Runs of pairs where both source and destination advance by one page."""
    runs = 0
    prev_src = prev_dst = -2
    for src, dst in pairs:
        if src != prev_src + 1 or dst != prev_dst + 1:
            runs += 1
        prev_src, prev_dst = src, dst
    return runs


@dataclass(slots=True)
class MemoryUsage:
    """A snapshot of KV memory, in pages and token slots.

    `num_used_pages + num_cached_free_pages + num_free_pages == num_total_pages`. Used pages hold
    `num_live_token_slots` tokens of live KV and `num_internal_frag_slots` allocated but empty slots
    (reservations included); `num_external_frag_pages` are free pages the allocator cannot hand out
    as the contiguous runs it needs (always 0 for paged allocation).
    """

    page_size: int
    num_total_pages: int
    num_used_pages: int
    num_cached_free_pages: int
    num_free_pages: int
    num_live_token_slots: int
    num_internal_frag_slots: int
    num_external_frag_pages: int
    num_host_total_pages: int
    num_host_used_pages: int
    num_prefix_queries: int  # prompt pages looked up in the prefix cache
    num_prefix_hits: int  # of those, found


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: compute `num_new_tokens` tokens after the computed ones."""

    request: Request
    num_new_tokens: int
    num_computed_tokens: int  # tokens whose KV is already in memory before this step


@dataclass(slots=True)
class SchedulerOutput:
    """One engine step's decisions.

    The batch is three parallel lists, in batch order (decodes and prefill chunks alike):
    `requests`, `num_new_tokens` (tokens each computes) and `num_computed_tokens` (tokens whose
    KV is already in memory); `scheduled` gives the same as `ScheduledRequest` objects. `mem_ops`
    is the memory work to do before the step's forward pass (swap-outs of preempted requests,
    copies, swap-ins). `preempted` were stopped this step (recompute or swap); `failed` finished
    with an error without running.
    """

    step_id: int
    mem_ops: MemOps = field(default_factory=MemOps)
    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_context_tokens: int = 0  # KV tokens attention reads this step, summed over requests
    num_attention_pairs: int = 0  # (query, key) pairs of the prefill chunks, for the quadratic term
    # decodes x the longest decode context: what attention reads padding decodes to the longest
    num_padded_context_tokens: int = 0

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        """The batch as objects (built on each call: the simulator never needs them)."""
        return [
            ScheduledRequest(request, new, done)
            for request, new, done in zip(
                self.requests, self.num_new_tokens, self.num_computed_tokens, strict=True
            )
        ]

    @property
    def num_seqs(self) -> int:
        """Requests in the batch."""
        return len(self.requests)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens computed this step."""
        return self.num_prefill_tokens + self.num_decode_tokens
