"""Eviction policies: which unreferenced cached prefix page is reused first.

A page with prefix content and no owner is "cached-free": it still serves prefix hits, but the
allocator may reclaim it. The eviction policy holds exactly those pages and picks the victim.
Calls: `add(page, depth, key)` when a cached page (at index `depth` of its prompt, holding the
prefix hash `key`) loses its last owner, `remove(page)` when a hit takes it back, `on_hit(page)` on
every prefix hit, `pop_victim()` to reclaim one (returns the page and its key; the manager drops
the content), `pages()` to list them, and `page in policy` asks whether it holds a page. A policy
may add the batched forms `add_pages(pages, keys)` and `pop_victims(n) -> (pages, keys)`.
`caches` is False only for `none`: no prefix caching.
"""

from __future__ import annotations

from kvlab.policies.eviction import cost, fifo, lfu, lru, none  # noqa: F401  (registers them)
