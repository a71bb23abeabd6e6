"""A run's precision mix as flat summary keys (the simulator's, the engine's and a cluster's
alike), from its pages at each level and its demotions, step by step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.policies.precision.driver import PrecisionDriver


def precision_summary(driver: PrecisionDriver, duration_s: float,
                      num_steps: int | None = None) -> dict[str, Any]:
    """`mix_summary` of a run's `num_steps` steps (the driver's last; None: all it sampled)."""
    mix = driver.mix
    start = 0 if num_steps is None else len(mix) - num_steps
    return mix_summary(driver.ledger.ladder.names,
                       [pages[start:] for pages in mix.pages_at_level],
                       [steps[start:] for steps in mix.demotions_to_level[1:]],
                       duration_s, driver.ledger.max_debt_pages)


def mix_summary(names: Sequence[str], pages_at_level: Sequence[Sequence[int]],
                demotions_to_level: Sequence[Sequence[int]], duration_s: float,
                max_debt_pages: int) -> dict[str, Any]:
    """Flat keys for a run's summary: the levels' `names` (the cache's dtype first), the mean
    share of held and cached pages at each (over steps: `pages_at_level[k]`, a value per
    step), the pages demoted into each level below the cache's dtype (`demotions_to_level[k -
    1]`, per step) and per second of `duration_s`, and the most ballast a ledger owed."""
    sums = [sum(pages) for pages in pages_at_level]
    demotions = [0, *(sum(steps) for steps in demotions_to_level)]
    total = sum(sums) or 1
    out: dict[str, Any] = {"precision_levels": "/".join(names)}
    out["precision_demotions_per_s"] = sum(demotions) / duration_s if duration_s > 0 else 0.0
    for level, name in enumerate(names):
        out[f"precision_share_{level}_{name}"] = sums[level] / total
        if level:
            out[f"precision_demotions_{level}_{name}"] = demotions[level]
    out["precision_max_debt_pages"] = max_debt_pages
    return out
