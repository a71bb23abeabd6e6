"""Precision policies: which KV pages are demoted to a lower precision, and when (protocol:
`kvlab.policies.precision.age.AgeDemotion`'s members; default `none`).

A demoted page keeps its slot in its block table and its content, requantized one or more
levels down the precision ladder (`ladder.py`); the bytes it no longer needs return to the pool
(`ledger.py`); `driver.py` applies a policy to the manager step by step; `summary.py` reports
the mix.
"""

from __future__ import annotations

from kvlab.policies.precision import age, none  # noqa: F401  (registers them)
