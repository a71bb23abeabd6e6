"""What the tiers are: the `--kv-tiers` spec (`TierSpec`, one tier; `TiersConfig`, the tiers in
order and how pages reach them) and its grammar.

Spec grammar (`parse_tiers`, the CLI's `--kv-tiers`): tiers in order, separated by commas or
`+` (one sweep value: `--grid kv_tiers=host:64GiB,host:64GiB+ssd:1TiB` is two runs), each
`KIND:SIZE[:OPTION=VALUE...]`, e.g. `host:512GiB,ssd:4TiB:eviction=arc`. KIND is host, ssd or
remote; SIZE a byte size (256MiB, 2GiB, 1.5TB) or a page count (`4096p`); options: eviction
(lru, fifo, lfu, arc, slru, cost), read and write (bandwidth, GB/s), latency (microseconds).
Unset link figures are the hardware's (the simulator fills them in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies import registry

TIER_KINDS = ("host", "ssd", "remote")
WRITE_POLICIES = ("write-back", "write-through")
AUTO_BLOCK = "auto"  # `TiersConfig.block_size`: settled by the requests' prefix keys
AUTO_BLOCK_TOKENS = 512  # the largest tier page `auto` takes (a Mooncake hash block)
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
    `chunk_size`), a multiple of the device page size; None: one device page; `auto` (the
    default): as large as keeps every hit (`for_prefix_blocks`; one device page until the
    requests are known, and for token-id prompts). A tier page of
    several device pages is named by its last page's prefix key, written whole (write-through:
    as that page is computed; write-back: as the device evicts that page, the first of the
    unit's pages to leave it, from the device pages holding the unit's content then; a unit
    whose pages are not all there is not written) and loaded whole (but for the device pages a
    hit holds already): a lookup's hit below the device ends where a tier page does. Only a
    caller that takes a shorter hit than the lookup found (`num_computed_tokens` below it)
    loads the first pages of its last tier page alone.
    """

    tiers: tuple[TierSpec, ...] = ()
    write_policy: str = "write-back"
    store_threshold: int = 0
    overlap: str = "none"
    block_size: int | str | None = AUTO_BLOCK

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
        if block is not None and block != AUTO_BLOCK and (
                isinstance(block, bool) or not isinstance(block, int) or block < 1):
            raise KvlabError(f"kv_tier_block_size {block!r}: expected a number of tokens >= 1, "
                             f"none (one device page) or {AUTO_BLOCK}",
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
        data.setdefault("block_size", None)  # (written before tier pages had a size: one page)
        return cls(tiers=parse_tiers(data.pop("tiers", "")), **data)

    def block_pages(self, page_size: int) -> int:
        """Device pages of `page_size` tokens per tier page (`block_size`); a KvlabError
        naming kv_tier_block_size where it is not a multiple of the page size."""
        block = self.block_size
        if block is None or block in (AUTO_BLOCK, page_size):
            return 1
        assert isinstance(block, int)
        if block % page_size:
            raise KvlabError(f"kv_tier_block_size {block}: expected a multiple of the page size "
                             f"({page_size} tokens)", parameters=("kv_tier_block_size",))
        return block // page_size

    def for_prefix_blocks(self, page_size: int, hash_block_size: int | None) -> TiersConfig:
        """This config with `auto` settled (others as they are) for requests whose prefix
        keys name blocks of `hash_block_size` tokens (a trace's hash ids; None: token-id
        hashes, or blocks of several sizes): the largest tier page of at most
        `AUTO_BLOCK_TOKENS` that is a multiple of `page_size` and divides the block, else one
        device page. Such requests share prefixes a whole block at a time, so a tier page
        inside a block loses no hit a page of one device page would take but in a prompt's
        last, partial block (the Mooncake excerpt: 11.53% against 11.54%, tier pages of 256
        or 512 tokens alike); token-id prompts share prefixes of any length, which a larger
        tier page would cut."""
        if self.block_size != AUTO_BLOCK:
            return self
        return replace(self, block_size=auto_block_size(page_size, hash_block_size))


def auto_block_size(page_size: int, hash_block_size: int | None) -> int | None:
    """`TiersConfig.for_prefix_blocks`' tier page: tokens, or None for one device page."""
    if hash_block_size is None:
        return None
    for tokens in range(AUTO_BLOCK_TOKENS // page_size * page_size, page_size, -page_size):
        if hash_block_size % tokens == 0:
            return tokens
    return None


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

