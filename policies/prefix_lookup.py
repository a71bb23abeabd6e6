"""Prefix-cache lookups: how much of a new request's prompt is cached, on the device and below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kvlab.policies.groups.table import Plan
from kvlab.policies.request import Request
from kvlab.policies.tiers import TierRuns, chain_head, chain_length

if TYPE_CHECKING:
    from kvlab.policies.page_pool import PagePool
    from kvlab.policies.tier_link import TierLink


class PageStops(Protocol):
    """Pages a prefix hit may not reach (`page in stops`)."""

    def __contains__(self, page: int) -> bool: ...


class PrefixLookup:
    """Looks up a request's page hashes in the pool's prefix-cache index (and the tiers), keeps
    the last lookup for the allocation that follows it, and counts queries and hits."""

    __slots__ = ("_last", "_pool", "_tiers", "caching", "num_hits", "num_queries", "page_size",
                 "stop_at")

    def __init__(self, pool: PagePool, page_size: int, caching: bool,
                 tiers: TierLink | None) -> None:
        self._pool = pool
        self._tiers = tiers
        self.page_size = page_size
        self.caching = caching
        self.num_queries = 0  # pages looked up at admissions
        self.num_hits = 0  # of those, found on the device
        # The last lookup: (request, cache epoch, hit pages[, tier hits, tier epoch]). A lookup
        # from another epoch may name a page that holds other content now.
        self._last: tuple | None = None
        # Pages a hit may not reach (precision recompute=1: the demoted ones); None: any.
        self.stop_at: PageStops | None = None

    def num_lookup_pages(self, seq: Request) -> int:
        """Pages a lookup may hit: full, hashed, and leaving the last token to compute."""
        return min(len(seq.page_hashes(self.page_size)), (seq.num_tokens - 1) // self.page_size)

    def num_computed_tokens(self, seq: Request) -> int:
        """`KVCacheManager.num_computed_prefix_tokens`."""
        if not self.caching:
            return 0
        hashes = seq.page_hashes(self.page_size)
        limit = self.num_lookup_pages(seq)
        cached = self._pool.cached
        pages: list[int] = []
        stop_at = self.stop_at
        for key in hashes[:limit]:
            page = cached.get(key)
            if page is None or (stop_at is not None and page in stop_at):
                break
            pages.append(page)
        epoch = self._pool.cache_epoch
        self._last = (seq.request_id, epoch, pages)
        tiers = self._tiers
        if tiers is not None and len(pages) < limit:
            below = tiers.chain(hashes, len(pages), limit)
            self._last = (seq.request_id, epoch, pages, below, tiers.epoch)
            return (len(pages) + chain_length(below)) * self.page_size
        return len(pages) * self.page_size

    def hit_pages(self, seq: Request) -> tuple[list[int], TierRuns, int]:
        """The cached pages a new sequence starts from, on the device and below it (runs of
        tier slots, `TierLink.chain`), and how many pages after them another instance sends:
        its `num_computed_tokens`, looked up again unless the last lookup was this sequence's
        and no key has left the cache (or a tier) since; tokens past the hit may be computed
        only as far as its `kv_transfer_tokens`."""
        num_computed = seq.num_computed_tokens
        if not num_computed:
            return [], [], 0
        last = self._last
        if not self.caching:
            last = (seq.request_id, self._pool.cache_epoch, [])
        elif (last is None or last[0] != seq.request_id or last[1] != self._pool.cache_epoch
                or (len(last) > 3 and self._tiers is not None
                    and last[4] != self._tiers.epoch)):
            self.num_computed_tokens(seq)
            last = self._last
            assert last is not None
        pages, below = last[2], last[3] if len(last) > 3 else []
        num_pages, partial = divmod(num_computed, self.page_size)
        num_hit = len(pages) + chain_length(below)
        if seq.kv_transfer_tokens and num_computed > num_hit * self.page_size:
            if num_computed > seq.kv_transfer_tokens:
                raise ValueError(
                    f"request {seq.request_id}: num_computed_tokens is {num_computed}, past "
                    f"its {seq.kv_transfer_tokens} transferred tokens")
            return pages, below, -(-num_computed // self.page_size) - num_hit
        if partial or num_pages > num_hit:
            # Raised, not asserted: under `python -O` the pages would be shared with a
            # sequence whose content differs.
            raise ValueError(
                f"request {seq.request_id}: num_computed_tokens is {num_computed}, but the "
                f"prefix cache holds {num_hit * self.page_size} of its "
                "tokens now (whole pages); set it from num_computed_prefix_tokens() (or to 0) "
                "just before allocate"
            )
        return pages[:num_pages], chain_head(below, num_pages - len(pages)), 0

    def count(self, seq: Request, plan: Plan) -> None:
        """A new sequence is about to take `plan`'s hits: count its queries and hits (and
        per tier level); the last lookup is spent."""
        self._last = None
        if not self.caching:
            return
        self.num_queries += self.num_lookup_pages(seq)
        self.num_hits += len(plan.hit_pages)
        if self._tiers is not None:
            self._tiers.count_hits(seq.page_hashes(self.page_size), len(plan.hit_pages),
                                   plan.tier_hits or [])

    def forget(self) -> None:
        """Drop the last lookup (its pages may be taken or gone)."""
        self._last = None
