"""KV events: every change a manager makes to its prefix cache, as vLLM publishes its own
(`--kv-events-config`: BlockStored, BlockRemoved, AllBlocksCleared).

A manager given a `KVEventLog` (`manager.events = KVEventLog()`) records a `BlockEvent` each
time a page's content enters the cache (stored) or leaves it (removed: evicted, or taken out
unwritten); the caller takes them once per step (`take`), as vLLM's scheduler does. A block is
named by its content key, the chained hash of the tokens up to its end (`hash_page`), so events
of two servers whose hash functions differ compare by content: see `kvlab.fidelity.kv_lockstep`.

A model with several KV-cache groups caches a page per group: each event names its group
(vLLM's `group_idx`). The hybrid manager's prefix-cache keys of a windowed group are
`(group index, page hash)`; the log splits them, so an event's `key` is always the page hash.
Plain keys (the plain manager's, and the first full-attention group's in the hybrid manager)
belong to the log's `plain_group`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

STORED = "stored"
REMOVED = "removed"
CLEARED = "cleared"


@dataclass(slots=True, frozen=True)
class BlockEvent:
    """One block entering (`stored`) or leaving (`removed`) the prefix cache, or the whole
    cache cleared (`cleared`, key 0).

    `key` is the block's prefix key (the manager's page hash: `hash_page` over token ids) and
    `group` the KV-cache group whose cache it is in (0 for a model with one group).
    A stored event also names the request whose computation filled the block, the key of the
    block before it (`parent`, None for a first block) and the block's token ids (None for a
    trace request without token content).
    """

    kind: str
    key: int
    request_id: int | None = None
    parent: int | None = None
    token_ids: tuple[int, ...] | None = None
    group: int = 0


def split_key(key: Hashable, plain_group: int = 0) -> tuple[int, int]:
    """(group index, page hash) of a prefix-cache key: a windowed group's `(group, hash)`
    tuple, else a plain hash of group `plain_group`."""
    if type(key) is tuple:
        group, page_hash = key
        return group, page_hash
    return plain_group, key  # type: ignore[return-value]


class KVEventLog:
    """The events a manager recorded since the last `take` (in the order it made them).

    `plain_group`: the group index of plain (untupled) keys: 0 for the plain manager; for the
    hybrid manager, the index of its first full-attention group (`plain_group_of`)."""

    __slots__ = ("pending", "plain_group")

    def __init__(self, plain_group: int = 0) -> None:
        self.pending: list[BlockEvent] = []
        self.plain_group = plain_group

    @classmethod
    def for_manager(cls, manager: object) -> KVEventLog:
        """A log whose plain keys belong to `manager`'s first full-attention group (its
        `groups`, where it has KV-cache groups; else group 0)."""
        groups = getattr(manager, "groups", None) or ()
        return cls(plain_group_of(group.kind for group in groups))

    def stored(self, key: Hashable, request_id: int, parent: Hashable | None,
               token_ids: tuple[int, ...] | None) -> None:
        """A block's content entered the cache."""
        group, page_hash = split_key(key, self.plain_group)
        parent_hash = None if parent is None else split_key(parent)[1]
        self.pending.append(BlockEvent(STORED, page_hash, request_id, parent_hash, token_ids,
                                       group))

    def removed(self, keys: Iterable[Hashable]) -> None:
        """These blocks' content left the cache, in this order."""
        plain = self.plain_group
        for key in keys:
            group, page_hash = split_key(key, plain)
            self.pending.append(BlockEvent(REMOVED, page_hash, group=group))

    def cleared(self) -> None:
        """Every block left the cache at once (a reset)."""
        self.pending.append(BlockEvent(CLEARED, 0))

    def take(self) -> list[BlockEvent]:
        """The events since the last call (the caller's step), oldest first."""
        events, self.pending = self.pending, []
        return events


def plain_group_of(group_kinds: Iterable[str]) -> int:
    """The group index of plain keys in a manager over groups of these kinds (vLLM's group
    order): its first full-attention group, 0 when it has none."""
    return next((index for index, kind in enumerate(group_kinds) if kind == "full"), 0)
