"""Longest prefix match, as SGLang's `--schedule-policy lpm` (its cache-aware default).

SGLang (python/sglang/srt/managers/schedule_policy.py) sorts its waiting queue, stably, by the
number of prompt tokens each request finds in the radix cache (device and host tiers), most
first, with two rules kept here: with more than 128 requests waiting it skips the matching and
the sort altogether (the queue keeps the order it has: SGLang's fallback to fcfs), and a request
that matches little in the cache (at most 32 tokens) but shares at least 32 leading tokens with
a request ahead of it in the queue is sent to the back ("in-batch prefix caching": the first
one computes the shared prefix, the others then hit it). Without a prefix cache it is fcfs.
Here the cache is the device prefix cache and the tiers below it
(`KVCacheManager.num_computed_prefix_tokens`), and shared prefixes are compared in whole pages.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvlab.policies.request import Request
from kvlab.policies.scheduling.base import BaseOrder, register_order, sort_in_place, starving_first

if TYPE_CHECKING:
    from kvlab.policies.manager import KVCacheManager

# SGLang's constants: the queue length above which lpm is skipped, and the in-batch thresholds
# (IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD / _DEPRIORITIZE_THRESHOLD, tokens).
SGLANG_MAX_QUEUE = 128
SGLANG_IN_BATCH_TOKENS = 32


@register_order("lpm", help="SGLang's longest prefix match: the waiting requests with the most "
                "cached prompt tokens first; as-is (fcfs) above max_queue=128 waiting; "
                "in_batch=32 defers requests sharing a prefix with one ahead (0: off)")
@dataclass(slots=True, frozen=True)
class LongestPrefixMatchOrder(BaseOrder):
    """Waiting requests by cached prefix length, longest first (stable: ties keep their order).

    `max_queue`: above this many waiting requests nothing is matched or sorted (SGLang: 128).
    `in_batch`: the in-batch prefix threshold in tokens (SGLang: 32; 0 turns it off).
    `max_wait_s`: kvlab's optional starvation guard (SGLang has none), as sjf's.
    """

    max_queue: int = SGLANG_MAX_QUEUE
    in_batch: int = SGLANG_IN_BATCH_TOKENS
    max_wait_s: float | None = None

    def arrange(self, queue: deque[Request], manager: KVCacheManager, now_s: float) -> None:
        """Sort by cached prefix tokens, most first, deferring in-batch duplicates; nothing
        when the manager caches no prefixes or the queue is longer than `max_queue`."""
        if not manager.caching or len(queue) > self.max_queue or len(queue) < 2:
            return
        matched = {}
        deferred = set()
        seen: set[int] = set()  # page keys of the requests ahead that were not deferred
        page_size = manager.page_size
        threshold = self.in_batch
        for request in queue:
            hit = manager.num_computed_prefix_tokens(request)
            matched[request.request_id] = hit
            if threshold <= 0 or hit > threshold:
                continue
            hashes = request.page_hashes(page_size)
            shared = 0
            for page_key in hashes:
                if page_key not in seen:
                    break
                shared += 1
            if shared * page_size >= threshold:
                deferred.add(request.request_id)
            else:
                seen.update(hashes)

        def key(request: Request) -> float:
            rid = request.request_id
            return float("inf") if rid in deferred else -matched[rid]

        sort_in_place(queue, starving_first(self.max_wait_s, now_s, key))
