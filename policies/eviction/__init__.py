"""Eviction policies: which unreferenced cached prefix page is reused first.

A page with prefix content and no owner is "cached-free": it still serves prefix hits, but the
allocator may reclaim it. The eviction policy holds exactly those pages and picks the victim.
Calls: `add(page, depth)` when a cached page loses its last owner, `remove(page)` when a hit takes
it back, `on_hit(page)` on every prefix hit, `pop_victim()` to reclaim one (its content is
dropped), `pages()` to list them. `caches` is False only for `none`: no prefix caching.
"""

from __future__ import annotations

from kvlab.policies.eviction import cost, fifo, lfu, lru, none  # noqa: F401  (registers them)
