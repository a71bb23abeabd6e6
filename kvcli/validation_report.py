"""The printed validation table: simulator against engine or server, metric by metric and
window by window, and the lockstep verdict (`kvlab validate`). Formatting only."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.fidelity import ValidationResult


def format_validation(result: ValidationResult) -> str:
    """The metric table (simulator, engine, relative error) and the lockstep verdict."""
    from kvlab.fidelity.validation import METRICS, WINDOW_METRICS, precision_rows
    rows = (*METRICS, *precision_rows(result.sim_summary))
    label_width = max(28, 1 + max(len(label) for label, _ in rows))
    width = label_width + 3 * 13
    reference = result.reference
    lines = [
        f" Simulator vs {reference} ".center(width, "="),
        f"{'Policy:':<{label_width}}{result.policy}",
        f"{'Calibration:':<{label_width}}{result.calibration}",
        f"{'Metric':<{label_width}}{'sim':>13}{reference:>13}{'rel. error':>13}",
        "-" * width,
    ]
    for label, key in rows:
        row = result.metrics[key]
        lines.append(f"{label:<{label_width}}{_number(row['sim']):>13}{_number(row[reference]):>13}"
                     f"{_percent(row['rel_error']):>13}")
    if result.windows:
        lines.append("-" * width)
        lines.append("Each window's error (output throughput, mean TTFT, mean TPOT):")
        for number, window in enumerate(result.windows, start=1):
            errors = ", ".join(
                _percent(window["metrics"][key]["rel_error"]) for key in WINDOW_METRICS
            )
            runs = window.get("num_repeats", 1)
            size = f"{window['num_prompts']} requests" + (f" x {runs} runs" if runs > 1 else "")
            lines.append(f"  window {number} ({size}): {errors}")
            if "server_repeats" in window:
                repeats = window["server_repeats"]
                spread = ", ".join(_spread(repeats[key]["max_rel_deviation"])
                                   for key in WINDOW_METRICS)
                lines.append(f"    {reference}'s own runs off their pool by up to: {spread}")
                error = ", ".join(_spread(repeats[key].get("rel_std_error"))
                                  for key in WINDOW_METRICS)
                lines.append(f"    its pool's standard error: {error}")
            if window.get("speed_sensitivity"):
                moves = ", ".join(_percent(None if move is None else move / 100.0)
                                  for move in (window["speed_sensitivity"].get(key)
                                               for key in WINDOW_METRICS))
                lines.append(f"    1% slower steps move these by: {moves}")
    if result.lockstep is not None:
        lines.append("-" * width)
        lines.append(f"{'Lockstep:':<{label_width}}{result.lockstep.describe()}")
    lines.extend(f"warning: {text}" for text in result.warnings)
    lines.append("=" * width)
    return "\n".join(lines)


def _spread(deviation: float | None) -> str:
    return "n/a" if deviation is None else f"{100.0 * deviation:.1f}%"


def _percent(error: float | None) -> str:
    return "n/a" if error is None else f"{100.0 * error:+.1f}%"


def _number(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isfinite(value) and value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.2f}"
