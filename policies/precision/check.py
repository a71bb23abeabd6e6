"""Whether a manager can demote under a precision policy, and the page ids it needs for it."""

from __future__ import annotations

from typing import Any

from kvlab.errors import KvlabError
from kvlab.policies.precision.age import AgeDemotion
from kvlab.policies.precision.ladder import PrecisionLadder
from kvlab.policies.precision.ledger import extra_pages


def check_precision(spec: Any, policy: AgeDemotion, ladder: PrecisionLadder | None,
                    groups: Any, num_pages: int) -> int:
    """The page ids the pool needs beyond the device's `num_pages` for `policy` over `ladder`;
    KvlabError where the manager cannot demote: no ladder given, an allocation other than
    paged, or several KV-cache groups."""
    where = f"policy {spec}"
    if ladder is None:
        raise KvlabError(f"{where}: precision={spec.precision} needs the precision ladder "
                         "of the cache's dtype (the simulator and the engine build it)")
    if spec.kind != "paged" or spec.block_sizing != "fixed":
        raise KvlabError(f"{where}: precision={spec.precision} needs kind=paged with "
                         "block_sizing=fixed")
    if groups is not None and [g.kind for g in groups] != ["full"]:
        raise KvlabError(f"{where}: precision={spec.precision} works on models with one "
                         "full-attention KV-cache group")
    if ladder.depth < policy.depth:
        raise KvlabError(f"{where}: precision depth={policy.depth}, but the ladder built has "
                         f"{ladder.depth} levels below the cache's dtype")
    return extra_pages(ladder, num_pages)
