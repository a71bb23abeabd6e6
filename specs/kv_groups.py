"""KV-cache groups: layers that share one block table, and which of their tokens stay needed.

A model's layers fall into groups (vLLM's KV-cache groups): every layer of a group keeps the same
kind of cache, so one block table serves them all. Full attention keeps every token; a sliding
window of W keeps the last W (a token attends to itself and the W - 1 before it, as HF and vLLM
count); chunked local attention keeps the tokens of the current chunk of C; a state group
(linear attention, Mamba) keeps one fixed-size state per request, whatever its length. All
groups draw pages from one pool of equal-size pages (see `kvlab.specs.kv_layout` for how the
bytes of a page are made equal across kinds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvlab.errors import KvlabError

GROUP_KINDS = ("full", "sliding_window", "chunked_local", "state")

# A block table entry whose page was given back (outside the window): never read.
NULL_PAGE = -1


@dataclass(slots=True, frozen=True)
class KVCacheGroup:
    """One KV-cache group: its kind, its layers, and its window or chunk in tokens.

    `window` is the sliding window W (`sliding_window`) or the chunk size C (`chunked_local`),
    0 otherwise. `num_layers` is how many model layers the group's pages hold (for reports and
    byte counts; the manager counts pages only).
    """

    kind: str = "full"
    num_layers: int = 1
    window: int = 0

    def __post_init__(self) -> None:
        if self.kind not in GROUP_KINDS:
            raise KvlabError(f"KV-cache group kind {self.kind!r}: expected one of "
                             f"{', '.join(GROUP_KINDS)}")
        if self.num_layers < 1:
            raise KvlabError(f"KV-cache group {self.kind}: num_layers is {self.num_layers}, "
                             "expected at least 1")
        windowed = self.kind in ("sliding_window", "chunked_local")
        if windowed and self.window < 1:
            raise KvlabError(f"KV-cache group {self.kind}: window is {self.window}, expected a "
                             "whole number of tokens >= 1")
        if not windowed and self.window:
            raise KvlabError(f"KV-cache group {self.kind} takes no window (got {self.window})")

    @property
    def label(self) -> str:
        """The group in words: `full`, `sliding_window(128)`, `chunked_local(8192)`, `state`."""
        return f"{self.kind}({self.window})" if self.window else self.kind

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens that no token from `num_computed_tokens` on attends to again: their
        pages may be given back (vLLM's `get_num_skipped_tokens`)."""
        if self.kind == "sliding_window":
            return max(0, num_computed_tokens - self.window + 1)
        if self.kind == "chunked_local":
            return num_computed_tokens // self.window * self.window
        return 0

    def pages_per_request(self, num_tokens: int, block_size: int, *,
                          max_in_flight_tokens: int | None = None,
                          enable_prefix_caching: bool = False) -> int:
        """Pool pages vLLM sets aside for a request of `num_tokens` tokens in this group (its
        `max_memory_usage_bytes` per page). `max_in_flight_tokens` (None: `num_tokens`, a
        whole request in one step) bounds the tokens a sliding or chunked group holds beyond
        its window."""
        in_flight = num_tokens if max_in_flight_tokens is None else max_in_flight_tokens
        if self.kind == "full":
            return -(-num_tokens // block_size)
        if self.kind == "sliding_window":
            # +1: a window need not start at a page boundary
            return -(-min(self.window - 1 + in_flight, num_tokens) // block_size) + 1
        if self.kind == "chunked_local":
            return -(-min(self.window + in_flight, num_tokens) // block_size)
        return 2 if enable_prefix_caching else 1


FULL_ATTENTION = KVCacheGroup()


def parse_groups(text: str) -> tuple[KVCacheGroup, ...]:
    """Groups from `KIND[(WINDOW)][xLAYERS],...`, e.g. `sliding_window(128)x18,fullx18`."""
    groups = []
    for index, part in enumerate(p.strip() for p in text.split(",")):
        match = _GROUP.fullmatch(part)
        if match is None:
            raise KvlabError(f"KV-cache group {index + 1} ({part!r}): expected "
                             "KIND[(WINDOW)][xLAYERS], e.g. sliding_window(128)x18")
        kind, window, layers = match.groups()
        groups.append(KVCacheGroup(kind, int(layers or 1), int(window or 0)))
    return tuple(groups)


_GROUP = re.compile(r"([a-z_]+)(?:\((\d+)\))?(?:x(\d+))?")
