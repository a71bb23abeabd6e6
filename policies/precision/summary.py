"""A run's precision mix as flat summary keys, from its driver's figures (the simulator's and
the engine's alike: `kvlab.metrics.precision_mix`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvlab.metrics.precision_mix import mix_summary

if TYPE_CHECKING:
    from kvlab.metrics import StepRecorder
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


def record_precision_mix(driver: PrecisionDriver, steps: StepRecorder,
                         duration_s: float) -> dict[str, Any]:
    """A finished run's mix: its steps' rows of the driver's mix added to `steps` as columns
    (`PrecisionMix.step_columns`), and its summary keys (`precision_summary`) returned."""
    num_steps = len(steps)
    steps.add_columns(driver.mix.step_columns(num_steps))
    return precision_summary(driver, duration_s, num_steps)
