"""KV events: every change a manager makes to its prefix cache, as vLLM publishes its own
(`--kv-events-config`: BlockStored, BlockRemoved, AllBlocksCleared).

A manager given a `KVEventLog` (`manager.events = KVEventLog()`) records a `BlockEvent` each
time a page's content enters the cache (stored) or leaves it (removed: evicted, or taken out
unwritten); the caller takes them once per step (`take`), as vLLM's scheduler does. A block is
named by its content key, the chained hash of the tokens up to its end (`hash_page`), so events
of two servers whose hash functions differ compare by content: see `kvlab.fidelity.kv_lockstep`.
"""

from __future__ import annotations

from dataclasses import dataclass

STORED = "stored"
REMOVED = "removed"
CLEARED = "cleared"


@dataclass(slots=True, frozen=True)
class BlockEvent:
    """One block entering (`stored`) or leaving (`removed`) the prefix cache, or the whole
    cache cleared (`cleared`, key 0).

    `key` is the block's prefix key (the manager's page hash: `hash_page` over token ids).
    A stored event also names the request whose computation filled the block, the key of the
    block before it (`parent`, None for a first block) and the block's token ids (None for a
    trace request without token content).
    """

    kind: str
    key: int
    request_id: int | None = None
    parent: int | None = None
    token_ids: tuple[int, ...] | None = None


class KVEventLog:
    """The events a manager recorded since the last `take` (in the order it made them)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[BlockEvent] = []

    def stored(self, key: int, request_id: int, parent: int | None,
               token_ids: tuple[int, ...] | None) -> None:
        """A block's content entered the cache."""
        self.pending.append(BlockEvent(STORED, key, request_id, parent, token_ids))

    def removed(self, keys: list) -> None:
        """These blocks' content left the cache, in this order."""
        self.pending.extend(BlockEvent(REMOVED, key) for key in keys)

    def cleared(self) -> None:
        """Every block left the cache at once (a reset)."""
        self.pending.append(BlockEvent(CLEARED, 0))

    def take(self) -> list[BlockEvent]:
        """The events since the last call (the caller's step), oldest first."""
        events, self.pending = self.pending, []
        return events
