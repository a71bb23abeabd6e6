"""The warnings of a server validation: windows whose mean TTFT is a queue (it follows the
server's speed in each run), windows on the edge of the server's KV memory (preempted in some
runs and not in others), and windows whose pooled server means are too unsure to judge the
simulator closely.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.bench import BenchResult
from kvlab.bench.observed import series_increase
from kvlab.fidelity.validation import WINDOW_METRICS

# A window whose mean TTFT moves more than this many percent per 1% of step time is a queue
# (a burst of arrivals waiting for prefills): a warning says its TTFT judges the server's own
# speed in each run more than the model (docs/validation.md).
QUEUE_SENSITIVITY = 2.0
# A window some of whose runs preempted no request while another preempted at least this
# many is on the edge of the server's KV memory: a warning says so (`preemption_warnings`).
PREEMPTION_EDGE = 3
# A window whose pooled server metric is uncertain by more than this many percent (one
# standard error of the mean over its runs) is a warning: a simulator error under about
# twice that is within the server's own noise (`noise_warnings`).
NOISY_POOL_PERC = 5.0


def queue_warnings(sensitivities: Sequence[dict[str, float | None] | None]) -> list[str]:
    """A warning for each window (numbered from 1) whose mean TTFT is a queue
    (`QUEUE_SENSITIVITY`)."""
    warnings = []
    for number, moves in enumerate(sensitivities, start=1):
        ttft = (moves or {}).get("mean_ttft_ms")
        if ttft is not None and ttft > QUEUE_SENSITIVITY:
            warnings.append(
                f"window {number}: its mean TTFT moves {ttft:.1f}% per 1% of the server's step "
                "time (requests queue for their prefill), so each run's TTFT follows the "
                "server's speed in that run more than the model; a lower load (--time-scale, "
                "--request-rate) judges the model better")
    return warnings


def preemption_warnings(windows: Sequence[Sequence[BenchResult]], role: str) -> list[str]:
    """A warning for each window (numbered from 1; `windows`: each one's runs) that the
    server preempted no request in one run and `PREEMPTION_EDGE` or more in another: whether
    its requests are preempted depends on its speed in the run (vLLM at 2x under 64 MiB:
    0, 0 and 13 preemptions, mean TTFT 49-312 ms), and the simulator, deterministic, takes
    one side for all of them."""
    warnings = []
    for number, runs in enumerate(windows, start=1):
        counts = [int(count) for run in runs  # (the summary's count, without the rest of it)
                  if (count := series_increase(run.series, "num_preemptions_total")) is not None]
        if len(counts) > 1 and min(counts) == 0 and max(counts) >= PREEMPTION_EDGE:
            warnings.append(
                f"{role} {number}: the server preempted {_listed(counts)} times in its runs "
                "of it: its KV memory is at the edge of this load, where each run's speed "
                "decides whether requests are preempted (and their TTFT by up to seconds); "
                "more KV memory on the server or a lower load judges the model better")
    return warnings


def _listed(counts: Sequence[int]) -> str:
    """'0, 0 and 13'."""
    words = [str(count) for count in counts]
    return ", ".join(words[:-1]) + f" and {words[-1]}"


def noise_warnings(windows: Sequence[dict[str, Any]],
                   limit_perc: float = NOISY_POOL_PERC) -> list[str]:
    """A warning for each window report (numbered from 1) whose pooled server metrics are
    uncertain by more than `limit_perc` (one standard error over its runs): the error the
    simulator can be judged on there, and about how many runs would halve it."""
    warnings = []
    for number, window in enumerate(windows, start=1):
        spread = window.get("server_repeats") or {}
        noisy = {key: error for key in WINDOW_METRICS
                 if (error := (spread.get(key) or {}).get("rel_std_error")) is not None
                 and 100.0 * error > limit_perc}
        if not noisy:
            continue
        named = ", ".join(f"{_WINDOW_LABELS[key]} +-{100.0 * error:.1f}%"
                          for key, error in noisy.items())
        runs = window.get("num_repeats", 1)
        warnings.append(
            f"window {number}: its {runs} runs leave the server's own means uncertain by "
            f"{named} (one standard error): a simulator error under about twice that is "
            f"within the server's noise; {4 * runs} runs (--num-repeats) would halve it")
    return warnings


_WINDOW_LABELS = {"output_throughput": "throughput", "mean_ttft_ms": "TTFT",
                  "mean_tpot_ms": "TPOT"}
