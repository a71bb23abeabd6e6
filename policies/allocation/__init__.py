"""Allocation policies: which free pages a new block takes (protocol: `interfaces.Allocator`).

An allocator owns the pages that are truly free (no owner and no cached prefix content) and hands
out blocks of them. Cached prefix pages are held by the eviction policy and are given back to the
allocator one by one when evicted.
"""

from __future__ import annotations

from kvlab.policies.allocation import buddy, contiguous, paged  # noqa: F401  (registers them)
