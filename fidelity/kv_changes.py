"""The server's side of the KV lockstep: the KV events it published (vLLM's BlockStored /
BlockRemoved / AllBlocksCleared) as per-block changes keyed by content.

The two sides hash differently, so a server block's key is kvlab's page hash (`hash_page`)
chained over the token ids its BlockStored carried, found again for its BlockRemoved through
the server's own hash. A change is a (kind, group, content key): the server's group is its
events' `group_idx` (vLLM 0.32; 0 where a server sends none).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.policies.kv_events import CLEARED, REMOVED, STORED
from kvlab.policies.request import hash_page

if TYPE_CHECKING:
    from kvlab.bench.kv_event_stream import KVEventStream

KINDS = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": CLEARED}


@dataclass(slots=True, frozen=True)
class Change:
    """One block entering or leaving a prefix cache: `key` is its content key (None where the
    server's event cannot be keyed), `step` the step (kvlab) or batch (server) that made it,
    `time_s` when (on the run's clock), `request_id` the request whose block it is where
    known, `group` the KV-cache group whose cache it is in; `sparse`: a server block of a run
    cached sparsely (its key unknown)."""

    kind: str
    key: int | None
    step: int
    time_s: float
    request_id: int | None = None
    duplicate: bool = False
    group: int = 0
    sparse: bool = False

    @property
    def item(self) -> tuple[str, int, int | None]:
        """What the alignment compares: (kind, group, content key)."""
        return self.kind, self.group, self.key



def server_changes(stream: KVEventStream) -> list[Change]:
    """The stream's events as per-block changes keyed by content, in publishing order, each
    in the KV-cache group its event names (`group_idx`, 0 where absent)."""
    # The server's hash -> content key. vLLM hashes a block's content alike in every group
    # (the group is not part of the published hash), so one map serves all groups.
    by_hash: dict[Any, int] = {}
    sparse: set[Any] = set()  # server hashes of blocks stored sparsely (content unknown)
    held: Counter[tuple[int, int]] = Counter()  # (group, content key) -> copies held
    changes: list[Change] = []
    for index, batch in enumerate(stream.batches):
        for event in batch.events:
            kind = KINDS[event["type"]]
            if kind == CLEARED:
                changes.append(Change(CLEARED, 0, index, batch.recv_s))
                held.clear()
            elif kind == STORED:
                changes.extend(_stored(event, by_hash, sparse, held, index, batch.recv_s))
            else:
                group = int(event.get("group_idx") or 0)
                for server_hash in event["block_hashes"]:
                    server_hash = _hashable(server_hash)
                    key = by_hash.get(server_hash)
                    duplicate = key is not None and held[group, key] > 1
                    if key is not None and held[group, key]:
                        held[group, key] -= 1
                    changes.append(Change(REMOVED, key, index, batch.recv_s, None, duplicate,
                                          group, key is None and server_hash in sparse))
    return changes


def _stored(event: dict[str, Any], by_hash: dict[Any, int], sparse: set[Any],
            held: Counter[tuple[int, int]], index: int, time_s: float) -> list[Change]:
    block_size, tokens = int(event["block_size"]), event["token_ids"]
    hashes = [_hashable(server_hash) for server_hash in event["block_hashes"]]
    group = int(event.get("group_idx") or 0)
    if len(tokens) != len(hashes) * block_size:
        # Masked blocks (vLLM's sparse retention) are left out of the hashes but not of the
        # tokens: which tokens each named block holds is unknown.
        sparse.update(hashes)
        return [Change(STORED, None, index, time_s, group=group, sparse=True) for _ in hashes]
    parent_hash = event.get("parent_block_hash")
    parent: int | None = 0 if parent_hash is None else by_hash.get(_hashable(parent_hash))
    changes = []
    for number, server_hash in enumerate(hashes):
        key = None
        if parent is not None:
            key = hash_page(parent, tokens[number * block_size:(number + 1) * block_size])
            by_hash[server_hash] = key
            held[group, key] += 1
        changes.append(Change(STORED, key, index, time_s, None,
                              key is not None and held[group, key] > 1, group))
        parent = key
    return changes


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
