"""Preemption modes: how a victim gives its memory back."""

from __future__ import annotations

from typing import Protocol

from kvlab.policies.registry import register


class PreemptionCosts(Protocol):
    """What `auto` asks the cost model (the simulator's, or the engine's measured one)."""

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        """Time to move pages over the host link in one direction."""
        ...

    def recompute_time_s(self, num_tokens: int) -> float:
        """Time to recompute the KV of `num_tokens` tokens (a prefill)."""
        ...


register(
    "preemption", "recompute", help="free the victim's pages; recompute its tokens later (vLLM)"
)("recompute")
register(
    "preemption", "swap", help="copy the victim's pages to host memory; recompute if host is full"
)("swap")
register(
    "preemption", "auto", help="swap when out-and-back transfer beats recomputation, else recompute"
)("auto")


def should_swap(
    mode: str, num_pages: int, num_transfers: int, num_tokens: int, costs: PreemptionCosts | None
) -> bool:
    """Whether a victim is swapped (True) or recomputed (False) under `mode`.

    `auto` compares the round trip (out and back in) with the recomputation; the manager refuses
    `auto` without a cost model.
    """
    if mode == "recompute":
        return False
    if mode == "swap":
        return True
    assert costs is not None, "preemption=auto needs a cost model"
    round_trip = 2 * costs.swap_time_s(num_pages, num_transfers)
    return round_trip < costs.recompute_time_s(num_tokens)
