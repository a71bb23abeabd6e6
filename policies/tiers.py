"""Memory tiers below device pages: the prefix cache spilled to host DRAM, local SSD or a
remote pool, each tier a bounded, content-addressed store of pages with its own eviction.

A tier holds copies of cached prefix pages, keyed by the same page hashes as the device's
prefix cache (`Request.page_hashes`). The manager (policies/manager.py) decides what moves:
a page evicted from the device is written to the first tier (write-back; with write-through
every page is written as soon as its KV is computed), a page a tier evicts moves down to the
next tier, and a prefix lookup that runs out of device pages goes on through the tiers, so a
hit below the device becomes a load into a fresh device page before the request's prefill.
Tiers are inclusive: a page loaded back stays in its tier. A tier page is one device page (the
same token slots and bytes), or several (`TiersConfig.block_size`: vLLM's offloaded block
size), so a tier's capacity in bytes is a number of device pages (`TierSpec.num_pages`), in
whole tier pages (`TierSpec.num_blocks`).

Spec grammar (`parse_tiers`, the CLI's `--kv-tiers`): tiers in order, separated by commas or
`+` (one sweep value: `--grid kv_tiers=host:64GiB,host:64GiB+ssd:1TiB` is two runs), each
`KIND:SIZE[:OPTION=VALUE...]`, e.g. `host:512GiB,ssd:4TiB:eviction=arc`. KIND is host, ssd or
remote; SIZE a byte size (256MiB, 2GiB, 1.5TB) or a page count (`4096p`); options: eviction
(lru, fifo, lfu, arc, slru, cost), read and write (bandwidth, GB/s), latency (microseconds).
Unset link figures are the hardware's (the simulator fills them in).
"""

from __future__ import annotations

import functools
import os
import re
import warnings
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, Protocol, cast

from kvlab.errors import KvlabError
from kvlab.policies import registry
from kvlab.policies.interfaces import Eviction, add_cached, pop_victims, recycle, take_hits

try:  # built from _tierstore.c where a C compiler was found at install (DictStore otherwise)
    from kvlab.policies._tierstore import TierStore as _CTierStore
except ImportError:  # pragma: no cover - an install without a C compiler
    _CTierStore = None  # type: ignore[assignment,misc]

TIER_KINDS = ("host", "ssd", "remote")
WRITE_POLICIES = ("write-back", "write-through")
OVERLAP_MODES = ("none", "layerwise")
_PAGES_SUFFIX = "p"


@dataclass(slots=True, frozen=True)
class TierSpec:
    """One tier: its kind, its size (bytes, or pages when `size_pages` is set), its eviction
    policy and, optionally, its link figures (bytes/s one way, seconds per transfer); None
    means the hardware preset's figure for the kind."""

    kind: str
    size_bytes: int = 0
    size_pages: int | None = None
    eviction: str = "lru"
    read_bandwidth: float | None = None
    write_bandwidth: float | None = None
    latency_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in TIER_KINDS:
            raise _tier_error(f"tier kind {self.kind!r}: expected one of {', '.join(TIER_KINDS)}")
        if self.size_pages is None and self.size_bytes <= 0:
            raise _tier_error(f"{self.kind} tier: size {self.size_bytes} bytes; expected > 0")
        if self.size_pages is not None and self.size_pages < 1:
            raise _tier_error(f"{self.kind} tier: {self.size_pages} pages; expected >= 1")
        if self.eviction not in registry.names("eviction"):
            raise _tier_error(f"{self.kind} tier: eviction {self.eviction!r}; expected one of "
                              + ", ".join(_caching_evictions()))
        if not registry.get("eviction", self.eviction).factory().caches:
            raise _tier_error(f"{self.kind} tier: eviction {self.eviction!r} caches nothing; "
                              f"a tier needs a caching policy ({', '.join(_caching_evictions())})")
        for name in ("read_bandwidth", "write_bandwidth", "latency_s"):
            value = getattr(self, name)
            if value is not None and not value >= (0.0 if name == "latency_s" else 1.0):
                raise _tier_error(f"{self.kind} tier: {name} {value!r}; expected a positive figure")

    def num_pages(self, page_bytes: int) -> int:
        """The tier's capacity in device pages of `page_bytes` bytes (at least one)."""
        if self.size_pages is not None:
            return self.size_pages
        if page_bytes <= 0:
            raise _tier_error(f"page of {page_bytes} bytes: expected > 0")
        pages = self.size_bytes // page_bytes
        if pages < 1:
            raise _tier_error(f"{self.kind} tier of {self.size_bytes} bytes holds no page of "
                              f"{page_bytes} bytes; make it larger")
        return pages

    def num_blocks(self, page_bytes: int, block_pages: int) -> int:
        """The tier's capacity in tier pages of `block_pages` device pages (at least one)."""
        pages = self.num_pages(page_bytes)
        if pages < block_pages:
            raise _tier_error(f"{self.kind} tier of {pages} device pages holds no tier page of "
                              f"{block_pages}; make it larger or the tier pages smaller")
        return pages // block_pages

    def to_string(self) -> str:
        """This tier in the spec grammar (`parse_tier` reads it back)."""
        size = f"{self.size_pages}{_PAGES_SUFFIX}" if self.size_pages is not None \
            else str(self.size_bytes)
        parts = [self.kind, size]
        if self.eviction != "lru":
            parts.append(f"eviction={self.eviction}")
        for key, name, scale in (("read", "read_bandwidth", 1e9), ("write", "write_bandwidth", 1e9),
                                 ("latency", "latency_s", 1e-6)):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{key}={value / scale:g}")
        return ":".join(parts)


@dataclass(slots=True, frozen=True)
class TiersConfig:
    """The tiers below device memory, in order, and how pages reach them.

    `write_policy`: write-back (a page is written to the first tier when the device evicts it)
    or write-through (as soon as its KV is computed; eviction then writes only what was
    skipped). `store_threshold`: write only pages whose content was hit at least that many
    times (vLLM's reuse gating; 0 writes every page). `overlap`: none (a step waits for its
    loads, then computes) or layerwise (loads stream layer by layer under the forward pass).
    `block_size`: tokens per tier page (vLLM's offloaded `block_size`, LMCache's
    `chunk_size`), a multiple of the device page size; None: one device page. A tier page of
    several device pages is written whole as its last page is computed (write-through only:
    the pages of a block leave the device one by one; and only then, not again as the device
    evicts them, so a tier smaller than the device's cache holds what the device does), found
    by its last page's prefix key, and loaded whole (but for the device pages a hit holds
    already): a lookup's hit below the device ends where a tier page does. Only a caller that
    takes a shorter hit than the lookup found (`num_computed_tokens` below it) loads the first
    pages of its last tier page alone.
    """

    tiers: tuple[TierSpec, ...] = ()
    write_policy: str = "write-back"
    store_threshold: int = 0
    overlap: str = "none"
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.write_policy not in WRITE_POLICIES:
            raise KvlabError(f"kv_tier_write {self.write_policy!r}: expected one of "
                             f"{', '.join(WRITE_POLICIES)}", parameters=("kv_tier_write",))
        if self.overlap not in OVERLAP_MODES:
            raise KvlabError(f"kv_tier_overlap {self.overlap!r}: expected one of "
                             f"{', '.join(OVERLAP_MODES)}", parameters=("kv_tier_overlap",))
        threshold = self.store_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise KvlabError(f"kv_tier_store_threshold {threshold!r}: expected a whole number "
                             ">= 0", parameters=("kv_tier_store_threshold",))
        block = self.block_size
        if block is not None and (isinstance(block, bool) or not isinstance(block, int)
                                  or block < 1):
            raise KvlabError(f"kv_tier_block_size {block!r}: expected a number of tokens >= 1",
                             parameters=("kv_tier_block_size",))
        kinds = [tier.kind for tier in self.tiers]
        for kind in set(kinds):
            if kinds.count(kind) > 1:
                raise _tier_error(f"more than one {kind} tier; give each kind once (a "
                                  "cluster shares one remote pool)")

    def __bool__(self) -> bool:
        return bool(self.tiers)

    def to_string(self) -> str:
        """The tiers in the spec grammar ("" for none)."""
        return ",".join(tier.to_string() for tier in self.tiers)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: the spec string and the write settings (`from_json` reads it back)."""
        return {"tiers": self.to_string(), "write_policy": self.write_policy,
                "store_threshold": self.store_threshold, "overlap": self.overlap,
                "block_size": self.block_size}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TiersConfig:
        """The config a `to_json` dict describes (None or {}: no tiers)."""
        if not data:
            return cls()
        data = dict(data)
        return cls(tiers=parse_tiers(data.pop("tiers", "")), **data)

    def block_pages(self, page_size: int) -> int:
        """Device pages of `page_size` tokens per tier page (`block_size`); a KvlabError
        naming kv_tier_block_size where it is not a multiple of the page size, or spans
        several pages under write-back."""
        block = self.block_size
        if block is None or block == page_size:
            return 1
        if block % page_size:
            raise KvlabError(f"kv_tier_block_size {block}: expected a multiple of the page size "
                             f"({page_size} tokens)", parameters=("kv_tier_block_size",))
        if self.write_policy != "write-through":
            raise KvlabError(f"kv_tier_block_size {block}: a tier page of several device pages "
                             "is written as it is computed; set kv_tier_write write-through",
                             parameters=("kv_tier_block_size", "kv_tier_write"))
        return block // page_size


def parse_tiers(text: str) -> tuple[TierSpec, ...]:
    """Tiers from the spec grammar (module docstring); "" or "none" is no tier."""
    text = text.strip()
    if text in ("", "none"):
        return ()
    return tuple(parse_tier(part) for part in re.split(r"[,+]", text))


def parse_tier(text: str) -> TierSpec:
    """One `KIND:SIZE[:OPTION=VALUE...]` tier."""
    from kvlab.policies.serving import parse_memory_size  # serving imports this module

    parts = [part.strip() for part in text.strip().split(":")]
    if len(parts) < 2 or not parts[1]:
        raise _tier_error(f"tier {text!r}: expected KIND:SIZE[:OPTION=VALUE...], e.g. "
                          "host:512GiB or ssd:4TiB:eviction=arc")
    kind, size = parts[0], parts[1]
    settings: dict[str, Any] = {}
    if size.lower().endswith(_PAGES_SUFFIX) and size[:-1].isdigit():
        settings["size_pages"] = int(size[:-1])
    else:
        settings["size_bytes"] = parse_memory_size(size, "kv_tiers")
    for option in parts[2:]:
        key, _, value = option.partition("=")
        settings.update(_tier_option(text, key.strip(), value.strip()))
    return TierSpec(kind, **settings)


def _tier_option(text: str, key: str, value: str) -> dict[str, Any]:
    if key == "eviction":
        return {"eviction": value}
    scales = {"read": ("read_bandwidth", 1e9), "write": ("write_bandwidth", 1e9),
              "latency": ("latency_s", 1e-6)}
    if key not in scales:
        raise _tier_error(f"tier {text!r}: unknown option {key!r}; expected eviction=, read= "
                          "(GB/s), write= (GB/s) or latency= (microseconds)")
    name, scale = scales[key]
    try:
        number = float(value)
    except ValueError:
        raise _tier_error(f"tier {text!r}: {key}={value!r} is not a number") from None
    return {name: number * scale}


def _caching_evictions() -> list[str]:
    """The eviction policies that keep cached pages (those a tier can use)."""
    return [name for name in registry.names("eviction")
            if registry.get("eviction", name).factory().caches]


def _tier_error(message: str) -> KvlabError:
    return KvlabError(f"kv_tiers: {message}", parameters=("kv_tiers",))


@dataclass(slots=True)
class TierStats:
    """What one tier did over a run, in device pages (a tier page of several counts them all)."""

    num_hits: int = 0  # prefix pages found here (and loaded to the device)
    num_stores: int = 0  # pages written here (from the device or the tier above)
    num_evictions: int = 0  # pages whose content this tier dropped (or moved down)
    num_demotions: int = 0  # of those, moved to the next tier

    def add(self, other: TierStats) -> None:
        """Count `other`'s pages in too (one pool's counters from each instance's share)."""
        self.num_hits += other.num_hits
        self.num_stores += other.num_stores
        self.num_evictions += other.num_evictions
        self.num_demotions += other.num_demotions

    def summary(self, kind: str) -> dict[str, int]:
        """The counters as summary keys of a tier of `kind` (`<kind>_tier_hit_pages`, ...)."""
        key = f"{kind}_tier"
        return {f"{key}_hit_pages": self.num_hits, f"{key}_stored_pages": self.num_stores,
                f"{key}_evicted_pages": self.num_evictions,
                f"{key}_demoted_pages": self.num_demotions}


class TierStore(Protocol):
    """A tier's pages: which key each holds and the order they are evicted in. Pages
    0 .. num_handed_out - 1 hold content (a page is never freed alone: content leaves only by
    eviction, which reuses the page at once), so the free pages are the tail of the range.
    Cached pages are evictable; a pinned one (a load of this step reads it) is not.

    Two implement it: `DictStore` (a dict and any eviction policy) and, for lru tiers where it
    is built, `kvlab.policies._tierstore.TierStore` (the same in C: `new_store`)."""

    @property
    def num_handed_out(self) -> int: ...
    @property
    def num_cached(self) -> int: ...
    def __contains__(self, key: object) -> bool: ...
    def get(self, key: Hashable) -> int | None: ...
    def pages_of(self, keys: list) -> list[int | None]: ...
    def holds_each(self, keys: list) -> list[bool]: ...
    def holds_any(self, keys: list) -> bool: ...
    def put_many(self, keys: list) -> tuple[list, list[int], list[int], list]: ...
    def put_into_free(self, keys: list) -> tuple[list[bool] | None, list[int]]: ...
    def pin(self, pages: list[int]) -> list[bool]: ...
    def unpin(self, pages: list[int], keys: list) -> None: ...
    def clear(self) -> None: ...
    def keys(self) -> list: ...
    def lru_pages(self) -> list[int]: ...
    def check(self, *, distinct: bool = True) -> None: ...


class DictStore:
    """A `TierStore` over a dict (key -> page) and an eviction policy of the registry (the
    device's policies, over tier pages: a tier page holds no owner)."""

    __slots__ = ("_num_handed_out", "_page_of", "eviction", "evictor", "num_total")

    def __init__(self, eviction: str, num_pages: int) -> None:
        self.num_total = num_pages
        self.eviction = eviction
        self.evictor: Eviction = registry.get("eviction", eviction).factory()
        self._page_of: dict[Hashable, int] = {}
        self._num_handed_out = 0

    @property
    def num_handed_out(self) -> int:
        """Pages holding content."""
        return self._num_handed_out

    @property
    def num_cached(self) -> int:
        """Pages evictable."""
        return len(self.evictor)

    def __contains__(self, key: object) -> bool:
        return key in self._page_of

    def get(self, key: Hashable) -> int | None:
        """The page holding `key`, or None."""
        return self._page_of.get(key)

    def pages_of(self, keys: list) -> list[int | None]:
        """Each key's page, or None."""
        return list(map(self._page_of.get, keys))

    def holds_each(self, keys: list) -> list[bool]:
        """Whether each key is held."""
        return list(map(self._page_of.__contains__, keys))

    def holds_any(self, keys: list) -> bool:
        """Whether any key is held."""
        return not self._page_of.keys().isdisjoint(keys)

    def put_many(self, keys: list) -> tuple[list, list[int], list[int], list]:
        """`PrefixTier.put_many`, but for the counters."""
        first_free = self._num_handed_out
        num_free = min(len(keys), self.num_total - first_free)
        num_victims = min(len(keys) - num_free, len(self.evictor))
        keys = keys[len(keys) - num_free - num_victims :]
        if not num_victims:  # the free pages hold them all (a tier filling up)
            return keys, self.put_into_free(keys)[1], [], []
        pages = list(range(first_free, first_free + num_free))
        self._num_handed_out += num_free
        if not num_free:  # full: the oldest pages take the new content
            victim_pages, victim_keys = recycle(self.evictor, num_victims, keys)
            pages = list(victim_pages)
        else:
            victim_pages, victim_keys = pop_victims(self.evictor, num_victims)
            pages += victim_pages
            add_cached(self.evictor, pages, keys)
        deque(map(self._page_of.pop, victim_keys), maxlen=0)  # their content is gone
        self._page_of.update(zip(keys, pages, strict=True))
        return keys, pages, victim_pages, victim_keys

    def put_into_free(self, keys: list) -> tuple[list[bool] | None, list[int]]:
        """`PrefixTier.put_into_free`, but for the counters."""
        assert len(keys) <= self.num_total - self._num_handed_out, "more keys than free pages"
        first, page_of = self._num_handed_out, self._page_of
        fresh = range(first, first + len(keys))
        pages = list(fresh)
        found = list(map(page_of.setdefault, keys, pages))
        stored: list[bool] | None = None
        if found != pages:  # some were held (at pages below `first`): the rest in a row again
            stored = [page is fresh_page for page, fresh_page in zip(found, pages, strict=True)]
            keys = list(compress(keys, stored))
            deque(map(page_of.pop, keys), maxlen=0)
            fresh = range(first, first + len(keys))
            pages = list(fresh)
            page_of.update(zip(keys, pages, strict=True))
        self._num_handed_out += len(keys)
        add_cached(self.evictor, fresh, keys)
        return stored, pages

    def pin(self, pages: list[int]) -> list[bool]:
        """Take the cached ones of `pages` out of the eviction order; whether each was."""
        return take_hits(self.evictor, pages)

    def unpin(self, pages: list[int], keys: list) -> None:
        """Pinned `pages` (holding `keys`) are evictable again: the most recently used (by
        LRU; other policies order them their own way), in order."""
        add_cached(self.evictor, pages, keys)

    def clear(self) -> None:
        """Drop every page's content (none pinned)."""
        self.evictor = registry.get("eviction", self.eviction).factory()
        self._page_of.clear()
        self._num_handed_out = 0

    def keys(self) -> list:
        """The keys held."""
        return list(self._page_of)

    def lru_pages(self) -> list[int]:
        """The cached pages in eviction order."""
        return self.evictor.pages()

    def check(self, *, distinct: bool = True) -> None:
        """Every page holding content holds a key; `distinct`: one only (a pass over the
        store)."""
        used = len(self._page_of)
        assert used == self._num_handed_out, "a tier page was lost (or holds two keys)"
        if distinct:
            assert len(set(self._page_of.values())) == used, "a tier page holds two keys"


def new_store(eviction: str, num_pages: int) -> TierStore:
    """A store of `num_pages` tier pages evicting by `eviction`: for lru, the C store where it
    is built (and KVLAB_TIER_STORE is not `python`), else a `DictStore`. Both give the same
    pages, victims and order (tests/policies/test_tier_store.py compares them)."""
    if eviction == "lru" and num_pages < 2**31 - 1 \
            and os.environ.get("KVLAB_TIER_STORE", "") != "python":
        if _CTierStore is not None:
            return _CTierStore(num_pages)
        _warn_no_c_store()
    return DictStore(eviction, num_pages)


@functools.cache
def _warn_no_c_store() -> None:
    """Say once per process that lru tiers run on the Python store (same results, slower)."""
    warnings.warn("kvlab.policies._tierstore is not built (no C compiler when kvlab was "
                  "installed): lru tiers use the Python store, with the same results; a "
                  "simulation with tiers takes up to about 1.3x longer (reinstall with a C "
                  "compiler to build it)", RuntimeWarning, stacklevel=3)


class PrefixTier:
    """A tier's pages at run time (a `TierStore`), its counters, and the pages pinned by a
    load of the step being decided (not evictable until `unpin_all`). A remote pool is one
    PrefixTier shared by the managers of a cluster.

    A tier page holds `block_pages` device pages (`TiersConfig.block_size`; tier page p is
    slots p * block_pages onwards of the tier's memory, in device pages) under the prefix key
    of its last one; `stats` count device pages.
    """

    __slots__ = ("_pinned", "_pinned_keys", "block_pages", "epoch", "num_total_pages", "spec",
                 "stats", "store")

    def __init__(self, spec: TierSpec, num_total_pages: int, block_pages: int = 1) -> None:
        self.spec = spec
        self.num_total_pages = num_total_pages
        self.block_pages = block_pages
        self.stats = TierStats()
        self.epoch = 0  # counts contents dropped: a lookup from an older epoch may be stale
        self.store = new_store(spec.eviction, num_total_pages)
        self._pinned: list[int] = []  # pages pinned this step, and their keys
        self._pinned_keys: list[Hashable] = []

    @property
    def kind(self) -> str:
        """host, ssd or remote."""
        return self.spec.kind

    @property
    def num_device_pages(self) -> int:
        """The tier's size in device pages (`block_pages` each of its pages)."""
        return self.num_total_pages * self.block_pages

    @property
    def num_used_pages(self) -> int:
        """Pages holding content (pinned ones included)."""
        return self.store.num_handed_out

    @property
    def num_free_pages(self) -> int:
        """Pages holding nothing."""
        return self.num_total_pages - self.store.num_handed_out

    @property
    def num_pinned_pages(self) -> int:
        """Pages a load of the current step reads."""
        return len(self._pinned)

    def page_of(self, key: Hashable) -> int | None:
        """The page holding `key`, or None."""
        return self.store.get(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.store

    def pin_many(self, pages: list[int], keys: list) -> None:
        """Loads read `pages` (holding `keys`) this step: count the hits and keep the pages
        from being evicted (one pinned already by another load of this step stays so)."""
        assert len(pages) == len(keys), "a key for each page"
        self.stats.num_hits += len(pages) * self.block_pages
        taken = self.store.pin(pages)  # (false for a page pinned already)
        self._pinned += compress(pages, taken)
        self._pinned_keys += compress(keys, taken)

    def unpin_all(self) -> None:
        """The step's loads are decided: the pages read become the most recently used (by
        LRU; other policies order them their own way)."""
        if self._pinned:
            self.store.unpin(self._pinned, self._pinned_keys)
            self._pinned, self._pinned_keys = [], []

    def put_many(self, keys: list) -> tuple[list, list[int], list[int], list]:
        """Give each of `keys` (none held here, no two alike) a page: free pages first, then
        the eviction policy's victims, in its order. Returns (the keys stored, their pages,
        the victims' pages, the victims' keys): when fewer pages are free or evictable than
        keys, the last keys are the ones stored (as one put after another would keep them),
        and a victim is always content from before this call."""
        stored, pages, victim_pages, victim_keys = self.store.put_many(keys)
        if victim_keys:
            self.stats.num_evictions += len(victim_keys) * self.block_pages
            self.epoch += 1
        self.stats.num_stores += len(stored) * self.block_pages
        return stored, pages, victim_pages, victim_keys

    def put_into_free(self, keys: list) -> tuple[list[bool] | None, list[int]]:
        """`put_many` of those of `keys` (no two alike) not held here, where the free pages
        have room for all of them: each takes the next free page. Returns which keys were
        stored (None: all) and their pages."""
        stored, pages = self.store.put_into_free(keys)
        self.stats.num_stores += len(pages) * self.block_pages
        return stored, pages

    def clear(self) -> None:
        """Drop every page's content (no page may be pinned)."""
        assert not self._pinned, "clear a tier while a load reads it"
        self.store.clear()
        self.epoch += 1

    def check(self, *, distinct: bool = True) -> None:
        """Conservation: every page free, or holding one key (and cached, or pinned).
        `distinct`: also that no two keys share a page (a pass over the tier's store)."""
        store = self.store
        assert store.num_cached + len(self._pinned) == store.num_handed_out, \
            "a tier page left its evictor"
        store.check(distinct=distinct)


def tier_chain(tiers: Sequence[TierStore], keys: list) -> list[tuple[int, list[int]]]:
    """The pages of each key in turn, from the first of `tiers` (level 1 first) holding it, up
    to the first key none holds, as runs `(level, pages)` of keys found in one tier: a prefix
    lookup below the device."""
    # A chain is runs of keys found in one tier (a prompt's pages move down together), so
    # the work is in C per run: the run's tier is the first holding its first key; its
    # pages, from that tier's column (a lookup per key from where the chain first needs the
    # tier, kept for later runs), to the first key the tier lacks; a higher tier holding none
    # of the run's keys (the usual case) is one membership pass.
    columns: dict[int, tuple[int, list]] = {}  # level -> (first key's index, pages from it)
    chain: list[tuple[int, list[int]]] = []
    start, num_keys = 0, len(keys)
    while start < num_keys:
        key = keys[start]
        level = next((level for level, held in enumerate(tiers, 1) if key in held), 0)
        if not level:
            break
        if level not in columns:
            columns[level] = (start, tiers[level - 1].pages_of(keys[start:]))
        first, pages = columns[level]
        end = _index_of(pages, None, start - first, len(pages)) + first
        for above in tiers[: level - 1]:  # a higher tier's copy breaks the run
            if above.holds_any(keys[start:end]):
                found = above.holds_each(keys[start:end])
                end = _index_of(found, True, 0, end - start) + start
        chain.append((level, cast("list[int]", pages[start - first : end - first])))
        start = end
    return chain


def chain_length(chain: list[tuple[int, list[int]]]) -> int:
    """The pages in a `tier_chain`."""
    return sum(len(pages) for _, pages in chain)


def chain_head(chain: list[tuple[int, list[int]]], num_pages: int) -> list[tuple[int, list[int]]]:
    """The first `num_pages` pages of a `tier_chain` (all of it when it is shorter)."""
    head: list[tuple[int, list[int]]] = []
    for level, pages in chain:
        if num_pages <= 0:
            break
        head.append((level, pages if len(pages) <= num_pages else pages[:num_pages]))
        num_pages -= len(pages)
    return head


def _index_of(values: Sequence, value: object, start: int, end: int) -> int:
    """The first index of `value` in values[start:end] (by equality), else `end`."""
    try:
        return values.index(value, start, end)
    except ValueError:
        return end


def build_tiers(config: TiersConfig, page_size: int, page_bytes: int,
                shared: dict[str, PrefixTier] | None = None) -> list[PrefixTier]:
    """The run-time tiers of one instance with device pages of `page_size` tokens and
    `page_bytes` bytes; a kind in `shared` (a cluster's remote pool) is that object, shared,
    instead of a new one."""
    shared = shared or {}
    return [shared.get(spec.kind) or build_tier(config, spec, page_size, page_bytes)
            for spec in config.tiers]


def build_tier(config: TiersConfig, spec: TierSpec, page_size: int,
               page_bytes: int) -> PrefixTier:
    """One tier of `config`, its pages `config.block_size` tokens each."""
    block_pages = config.block_pages(page_size)
    return PrefixTier(spec, spec.num_blocks(page_bytes, block_pages), block_pages)


def tier_summary(tiers: list[PrefixTier], stats: list[TierStats], first_hit_pages: list[int],
                 page_size: int, num_prompt_tokens: int,
                 busy_s: list[float] | None = None) -> dict[str, Any]:
    """A run's tier counters as flat summary keys. Hit rates are shares of the prompt tokens
    of the requests scheduled, hit at their first admission, as `prefix_cache_hit_rate_perc`
    counts them (which is their sum): the device's own, then each tier's (`<kind>_tier_...`);
    then per tier its size in device pages and, from `stats` (the run's own counters: a manager's
    `tier_stats`, its share of a pool shared by a cluster), pages hit (every admission,
    re-admissions after a preemption too), stored, evicted, moved down and, from the
    simulator, its link's busy seconds."""
    def rate(pages: int) -> float:
        return 100.0 * pages * page_size / num_prompt_tokens if num_prompt_tokens else 0.0

    summary: dict[str, Any] = {"device_prefix_hit_rate_perc": rate(first_hit_pages[0])}
    for index, tier in enumerate(tiers):
        key = f"{tier.kind}_tier"
        summary[f"{key}_pages"] = tier.num_device_pages
        summary[f"{key}_hit_rate_perc"] = rate(first_hit_pages[index + 1])
        summary.update(stats[index].summary(tier.kind))
        if busy_s is not None:
            summary[f"{key}_link_busy_s"] = busy_s[index]
    return summary
