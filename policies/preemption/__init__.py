"""Preemption policies: which running request yields memory (victim), and how (mode).

Victims: `pick(candidates, pages_held) -> Request`. Modes: `recompute` frees the victim's pages
and recomputes its tokens later; `swap` copies them to a bounded host pool (recompute when the
pool is full); `auto` swaps when the cost model says the transfer is faster than recomputing.
"""

from __future__ import annotations

from kvlab.policies.preemption import modes, victims  # noqa: F401  (registers them)
