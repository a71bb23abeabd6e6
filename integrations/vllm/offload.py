"""kvlab's eviction policies as vLLM's offloading `CachePolicy` (the CPU tier of the
offloading connector): pass `"cache_policy_module_path": "kvlab.integrations.vllm.offload"` and
`"eviction_policy": "KvlabARC"` (or KvlabLRU, KvlabFIFO, KvlabLFU, KvlabSLRU, KvlabCost) in
the connector's `kv_connector_extra_config`.

Imported by vLLM only (it subclasses vLLM's `CachePolicy`). The chunk store is vLLM's contract;
the kvlab policy holds the evictable chunks (ready, no transfer reading them) as pages, a
chunk's page id being its CPU slot (`chunk_id`), and decides the victims:

- a chunk becomes evictable (`insert` of a ready chunk, `mark_evictable`): `add`, as kvlab's
  pool releases a page; it stops being evictable (`mark_non_evictable`, `remove`): `remove`;
- a request reuses chunks (`on_request_finished`'s `reused_keys`, `touch`): `on_hit` on each,
  and an evictable one is released again (`remove`, `add`): it is the most recently used;
  keys are taken tail first, so a prefix's head is released last, as kvlab's pool does;
- `evict(n, protected)`: the policy's next `n` victims. Protected chunks that the policy
  holds are taken out first and released again after (their recency renewed, as the request
  that protects them renews it when it finishes); atomic: None, with nothing changed, when
  fewer than `n` unprotected chunks are evictable.

vLLM 0.32 runs this connector's worker side on CUDA and XPU only: the adapter is tested here
against the `CachePolicy` contract (tests/peer), and the end-to-end path is unverified here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, order_request_keys

from kvlab.policies import registry
from kvlab.policies.interfaces import Eviction, add_cached, pop_victims


class KvlabCachePolicy(CachePolicy):  # type: ignore[misc]
    """vLLM's CachePolicy over a kvlab eviction policy named by `policy_name`."""

    policy_name = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[Any, Any] = {}  # key -> ChunkStatus
        self._key_of: dict[int, Any] = {}  # chunk_id -> key
        self._depth: dict[Any, int] = {}  # key -> its position in its request, where known
        self.evictor: Eviction = self._new_evictor()

    def _new_evictor(self) -> Eviction:
        """A fresh kvlab policy of `policy_name`."""
        policy: Eviction = registry.get("eviction", self.policy_name).factory()
        return policy

    def get(self, key: Any) -> Any:
        """The chunk stored under `key`, or None."""
        return self.chunks.get(key)

    def insert(self, key: Any, chunk: Any) -> None:
        """A newly allocated chunk; evictable at once when it is ready and unread."""
        self.chunks[key] = chunk
        self._key_of[chunk.chunk_id] = key
        if chunk.ref_cnt == 0:
            self._release([key])

    def remove(self, key: Any) -> None:
        """Forget a chunk (a failed store)."""
        chunk = self.chunks.pop(key)
        self._key_of.pop(chunk.chunk_id, None)
        self._depth.pop(key, None)
        if chunk.chunk_id in self.evictor:
            self.evictor.remove(chunk.chunk_id)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        """A reuse of each stored chunk of `keys` (head to tail)."""
        keys = list(keys)
        self._note_positions(keys, req_context)
        self._reuse(keys, set(keys))

    def on_request_finished(self, key_groups: Sequence[Sequence[Any]],
                            insertion_only_keys: set[Any], reused_keys: set[Any],
                            req_context: Any) -> None:
        """A request's accesses in prefix order: the reused chunks are hits; every stored
        chunk it saw is renewed."""
        keys = order_request_keys(key_groups, req_context)
        self._note_positions(keys, req_context)
        self._reuse(keys, reused_keys)

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, Any]] | None:
        """Exactly `n` victims in the kvlab policy's order, none of `protected`; None (and no
        change) when that many are not evictable."""
        if n == 0:
            return []
        evictor = self.evictor
        shielded = [page for page in evictor.pages() if self._key_of[page] in protected]
        if len(evictor) - len(shielded) < n:
            return None
        for page in shielded:
            evictor.remove(page)
        pages, _ = pop_victims(evictor, n)
        self._release([self._key_of[page] for page in shielded])
        evicted = []
        for page in pages:
            key = self._key_of.pop(page)
            self._depth.pop(key, None)
            evicted.append((key, self.chunks.pop(key)))
        return evicted

    def clear(self) -> None:
        """Drop every chunk and the policy's whole state (a fresh policy)."""
        self.chunks.clear()
        self._key_of.clear()
        self._depth.clear()
        self.evictor = self._new_evictor()

    def mark_evictable(self, key: Any) -> None:
        """The chunk's last reader finished (or its store completed)."""
        self._release([key])

    def mark_non_evictable(self, key: Any) -> None:
        """A transfer reads the chunk: it may not be evicted meanwhile."""
        page = self.chunks[key].chunk_id
        if page in self.evictor:
            self.evictor.remove(page)

    def _release(self, keys: list[Any]) -> None:
        """The chunks of `keys` become evictable, in that order (the last most recent)."""
        chunks, depth = self.chunks, self._depth
        keys = [key for key in keys if chunks[key].chunk_id not in self.evictor]
        add_cached(self.evictor, [chunks[key].chunk_id for key in keys], keys,
                   [depth.get(key, 0) for key in keys])

    def _reuse(self, keys: list[Any], hits: set[Any]) -> None:
        """Tail first: each stored chunk of `keys` in `hits` is hit; each evictable one is
        released again."""
        evictor, renewed = self.evictor, []
        for key in reversed(keys):
            chunk = self.chunks.get(key)
            if chunk is None:
                continue
            cached = chunk.chunk_id in evictor
            if cached:
                evictor.remove(chunk.chunk_id)
            if key in hits:
                evictor.on_hit(chunk.chunk_id)
            if cached:
                renewed.append(key)
        self._release(renewed)

    def _note_positions(self, keys: list[Any], req_context: Any) -> None:
        """Remember each key's position in its request: its end token less one stands for
        the cost policy's depth (chunks are all one size, so (end token) x (hits + 1) orders
        them as (depth + 1) x (hits + 1) does)."""
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is not None:
                self._depth[key] = max(0, int(position) - 1)


class KvlabLRU(KvlabCachePolicy):
    """kvlab's `lru`."""

    policy_name = "lru"


class KvlabFIFO(KvlabCachePolicy):
    """kvlab's `fifo`."""

    policy_name = "fifo"


class KvlabLFU(KvlabCachePolicy):
    """kvlab's `lfu`."""

    policy_name = "lfu"


class KvlabSLRU(KvlabCachePolicy):
    """kvlab's `slru`."""

    policy_name = "slru"


class KvlabARC(KvlabCachePolicy):
    """kvlab's `arc` (its ghost lists as long as the tier has chunks)."""

    policy_name = "arc"

    def _new_evictor(self) -> Eviction:
        """kvlab's ARC sized to the tier (its ghost lists hold as many keys as it has chunks)."""
        policy: Eviction = registry.get("eviction", "arc").factory(self.cache_capacity)
        return policy


class KvlabCost(KvlabCachePolicy):
    """kvlab's `cost` (a chunk's depth is its position in the request that last used it)."""

    policy_name = "cost"
