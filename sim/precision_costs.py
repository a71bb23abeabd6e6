"""What mixed-precision pages cost a simulated step: the requantizations a precision policy
decided (each page read at its old level and written at its new one, at HBM bandwidth) and the
cheaper reads of demoted pages (policies/precision/)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.policies import SchedulerOutput
    from kvlab.policies.precision.driver import PrecisionDriver
    from kvlab.policies.precision.run import RunDemotions
    from kvlab.sim.cost_model import CostModel


def precision_step_time_s(cost_model: CostModel, output: SchedulerOutput,
                          driver: PrecisionDriver) -> float:
    """The step's time with its batch's demoted pages read at their levels, plus its
    requantizations.

    Reads: the context tokens attention reads, less those the demoted pages spare
    (`PrecisionDriver.num_saved_context_tokens`, in tokens at the cache's dtype), so the
    roofline's KV bytes shrink; its attention FLOPs shrink by the same tokens (an undercount
    of compute where a step is compute-bound). Requantizing a page reads it at its old level
    and writes it at its new one: a copy's time (read + write of a full page) scaled by the two
    levels' byte ratios (`requantize_time_s`: the roofline's `copy_time_s`, a calibrated
    model's fitted time). What reading the demoted pages costs beyond their
    bytes is the cost model's (`demoted_read_time_s`: 0 but for a calibrated CPU engine).
    """
    saved = driver.num_saved_context_tokens(output.requests)
    context, padded = output.num_context_tokens, output.num_padded_context_tokens
    if saved > 0 and context > 0:
        # The output itself, its context lowered while the cost model reads it (a copy of
        # its many fields costs more than the step's other precision work).
        keep = max(0.0, 1.0 - saved / context)
        output.num_context_tokens = round(context * keep)
        output.num_padded_context_tokens = round(padded * keep)
        try:
            time_s = cost_model.step_time_s(output)
        finally:
            output.num_context_tokens, output.num_padded_context_tokens = context, padded
        time_s += cost_model.demoted_read_time_s(saved)
    else:
        time_s = cost_model.step_time_s(output)
    requantize = output.mem_ops.requantize
    if requantize:  # (from the step's counts where they sum exactly: `requantized_pages`)
        time_s += cost_model.requantize_time_s(driver.requantized_pages(requantize))
    return time_s


def demoted_run_timer(timer: Callable[[int, int], float], run: RunDemotions,
                      requantize_time_s: Callable[[float], float],
                      demoted_read_time_s: Callable[[float], float]
                      ) -> Callable[[int, int], float]:
    """A decode run's step timer (context, padded context -> seconds, the run's steps in
    turn) with each step's demoted pages read at their levels and its requantizations
    (`run.costs`), as `precision_step_time_s` charges a step, with the cost model's
    `requantize_time_s` and `demoted_read_time_s`."""
    costs, steps = run.costs, itertools.count()

    def time_s(num_context: int, num_padded: int) -> float:
        saved, pages = costs(next(steps))
        if saved > 0 and num_context > 0:
            keep = max(0.0, 1.0 - saved / num_context)
            seconds = timer(round(num_context * keep), round(num_padded * keep))
            seconds += demoted_read_time_s(saved)
        else:
            seconds = timer(num_context, num_padded)
        if pages:
            seconds += requantize_time_s(pages)
        return seconds

    return time_s
