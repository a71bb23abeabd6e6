"""The read-only side of the KV-cache manager: its counts, tables and snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.policies.groups.full import FullAttentionManager
from kvlab.policies.groups.table import SeqState
from kvlab.policies.host_pool import HostPool
from kvlab.policies.interfaces import Allocator, BlockSizing, Eviction
from kvlab.policies.kv_events import KVEventLog
from kvlab.policies.outputs import MemoryUsage
from kvlab.policies.page_pool import PagePool
from kvlab.policies.preemption.modes import PreemptionCosts
from kvlab.policies.prefix_lookup import PrefixLookup
from kvlab.policies.request import Request
from kvlab.policies.spec import PolicySpec
from kvlab.policies.tiers import PrefixTier, TierStats

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvlab.policies.precision.driver import PrecisionDriver
    from kvlab.policies.step_records import StepRecords
    from kvlab.policies.tier_link import TierLink


class ManagerView:
    """What a `KVCacheManager` holds, and every question about it that changes nothing
    (the manager's state is built by `KVCacheManager.__init__`)."""

    # Slotted: every decode step reads and writes a few of these.
    __slots__ = (
        "_grow",
        "_lookup",
        "_main",
        "_seqs",
        "_steps",
        "_tier_link",
        "allocator",
        "block_sizing",
        "caching",
        "costs",
        "evictor",
        "host",
        "max_model_len",
        "num_total_pages",
        "page_size",
        "policy",
        "pool",
        "precision",
        "tiers",
    )

    _grow: Callable[[SeqState, int], bool] | None
    _lookup: PrefixLookup
    _main: FullAttentionManager
    _seqs: dict[int, SeqState]
    _steps: StepRecords
    _tier_link: TierLink | None
    allocator: Allocator
    block_sizing: BlockSizing
    caching: bool
    costs: PreemptionCosts | None
    evictor: Eviction
    host: HostPool
    max_model_len: int
    num_total_pages: int
    page_size: int
    policy: PolicySpec
    pool: PagePool
    precision: PrecisionDriver | None
    tiers: list[PrefixTier] | None

    # ----------------------------------------------------------------------------- queries

    @property
    def seq_states(self) -> dict[int, SeqState]:
        """Each held sequence's state (block table, tokens, the precision driver's entry), by
        request id: the manager's own dict, in admission order, for reading."""
        return self._seqs

    @property
    def events(self) -> KVEventLog | None:
        """Set to a KVEventLog to record every prefix-cache change (vLLM's KV events)."""
        return self.pool.events

    @events.setter
    def events(self, log: KVEventLog | None) -> None:
        self.pool.events = log

    @property
    def tier_stats(self) -> list[TierStats]:
        """What this manager did in each tier (a cluster's managers may share the tiers)."""
        return self._tier_link.tier_stats if self._tier_link is not None else []

    @property
    def first_hit_pages(self) -> list[int]:
        """Pages hit at requests' first admissions, per level (device, then each tier)."""
        return self._tier_link.first_hit_pages if self._tier_link is not None else [0]

    @property
    def watermark_pages(self) -> int:
        """Pages kept free when admitting a new request."""
        return self._main.watermark_pages

    @property
    def num_prefix_queries(self) -> int:
        """Pages looked up at admissions."""
        return self._lookup.num_queries

    @property
    def num_prefix_hits(self) -> int:
        """Pages found on the device at admissions."""
        return self._lookup.num_hits

    @property
    def num_host_pages(self) -> int:
        """Host swap pages in all."""
        return self.host.num_total_pages

    @property
    def num_free_pages(self) -> int:
        """Pages with no owner and no cached content."""
        return self.pool.num_free_pages

    @property
    def num_cached_free_pages(self) -> int:
        """Pages with no owner that still hold a cached prefix (reclaimable)."""
        return self.pool.num_cached_free_pages

    @property
    def num_used_pages(self) -> int:
        """Pages held by at least one sequence."""
        return self.pool.num_used_pages

    def block_table(self, seq: Request) -> list[int]:
        """The sequence's page ids in token order (empty when it holds none). Do not mutate."""
        state = self._seqs.get(seq.request_id)
        return state.pages if state is not None else []

    def num_pages_held(self, seq: Request) -> int:
        """Pages in the sequence's block table."""
        state = self._seqs.get(seq.request_id)
        return len(state.pages) if state is not None else 0

    def num_owners(self, page: int) -> int:
        """How many block tables hold `page` (0: free or cached-free). A debugging aid: O(pages
        held) for a page not shared, which the manager does not count."""
        count = self.pool.owners.get(page)
        if count is not None:
            return count
        return int(any(page in state.pages for state in self._seqs.values()))

    def is_swapped(self, seq: Request) -> bool:
        """True while the sequence's KV lives in host memory."""
        return self.host.holds(seq.request_id)

    def num_computed_prefix_tokens(self, seq: Request) -> int:
        """Leading tokens whose KV is cached, in whole pages, capped at the token count - 1 (as
        vLLM: the last token is always computed). A request recomputed after preemption can hit
        its output pages too where their ids are known (`Request.output_ids_known`)."""
        return self._lookup.num_computed_tokens(seq)

    def pages_needed_alone(self, seq: Request) -> int:
        """Pages the request holds at its largest with memory to itself: a request runs to its
        end whenever these fit in the cache (paging and buddy runs take exactly its length;
        a contiguous region takes what its reservation rule reserves)."""
        return -(-self._main.tokens_needed_alone(seq) // self.page_size)

    def explain_pages_needed(self, seq: Request) -> str:
        """Which rule sets `pages_needed_alone(seq)`, in words (for an error message)."""
        length = f"{seq.total_len} tokens: {seq.prompt_len} prompt + {seq.max_output_tokens} output"
        tokens = self._main.tokens_needed_alone(seq)
        if tokens > seq.total_len:
            return (
                f"contiguous allocation with reserve={self.policy.reserve} reserves {tokens} "
                f"tokens for this request of {length}"
            )
        return f"{length}, in pages of {self.page_size} tokens"

    def usage(self) -> MemoryUsage:
        """A snapshot of device and host memory (O(1) for paged allocation)."""
        # (num_used_pages's sum, with each count read once: this runs once per step)
        free, cached = self.allocator.num_free_pages, len(self.evictor)
        total = self.num_total_pages
        if self.precision is not None:  # and the page ids demotion's freed bytes pay for
            ledger = self.precision.ledger
            total += ledger.num_extra - ledger.num_ballast_pages
        used = total - free - cached
        main = self._main
        live = main.num_live_slots - main.num_dup_slots
        lookup = self._lookup
        # Positional, in MemoryUsage's field order: keywords cost twice the whole call.
        return MemoryUsage(
            self.page_size,
            total,
            used,  # num_used_pages
            cached,  # num_cached_free_pages
            free,  # num_free_pages
            live,  # num_live_token_slots
            used * self.page_size - live,  # num_internal_frag_slots
            self.allocator.num_unusable_free_pages(),  # num_external_frag_pages
            self.host.num_total_pages,
            self.host.num_used_pages,
            lookup.num_queries,
            lookup.num_hits,
        )
