"""A run's precision mix as flat summary keys (the simulator's and the engine's alike)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.policies.precision.driver import PrecisionDriver


def precision_summary(driver: PrecisionDriver, duration_s: float,
                      num_steps: int | None = None) -> dict[str, Any]:
    """Flat keys for a run's summary over its `num_steps` steps (the driver's last; None: all
    it sampled): the levels' names, the mean share of held and cached pages at each (over
    steps), pages demoted into each and per second of `duration_s`, and the most ballast the
    ledger ever owed."""
    ledger, mix = driver.ledger, driver.mix
    start = 0 if num_steps is None else len(mix) - num_steps
    sums = [sum(pages[start:]) for pages in mix.pages_at_level]
    demotions = [sum(steps[start:]) for steps in mix.demotions_to_level]
    total = sum(sums) or 1
    out: dict[str, Any] = {"precision_levels": "/".join(ledger.ladder.names)}
    out["precision_demotions_per_s"] = sum(demotions) / duration_s if duration_s > 0 else 0.0
    for level, name in enumerate(ledger.ladder.names):
        out[f"precision_share_{level}_{name}"] = sums[level] / total
        if level:
            out[f"precision_demotions_{level}_{name}"] = demotions[level]
    out["precision_max_debt_pages"] = ledger.max_debt_pages
    return out

