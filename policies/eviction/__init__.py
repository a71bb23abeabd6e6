"""Eviction policies: which unreferenced cached prefix page is reused first (protocol:
`interfaces.Eviction`; the scored ones share `heap.HeapEviction`).

A page with prefix content and no owner is "cached-free": it still serves prefix hits, but the
allocator may reclaim it. The eviction policy holds exactly those pages and picks the victim.
"""

from __future__ import annotations

from kvlab.policies.eviction import (  # noqa: F401  (registers them)
    arc,
    cost,
    fifo,
    lfu,
    lru,
    none,
    slru,
)
