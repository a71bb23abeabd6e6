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

    def max_pages(self, num_tokens: int, page_size: int) -> int:
        """The most pages a request of `num_tokens` tokens holds in this group at once, one
        token computed per step (a decode): the pages its live tokens span."""
        if self.kind == "state":
            return 1
        whole = -(-num_tokens // page_size)
        if self.kind == "full":
            return whole
        # W tokens (or a chunk) starting anywhere in a page span one page more than they fill
        return min(whole, -(-(self.window - 1) // page_size) + 1)


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
