"""The benchmark client's host CPU: how much of it the hypervisor withheld during a run
(steal time: the time a virtual CPU was ready to run and was not run, for the hypervisor's
other guests or its own work).

On the team's 2-core virtual machine the steal share moved between 0 and a third of the CPU
from one 20-second window to the next, and a server there slowed down with it: a step of the
same shape took 1.5-1.7x longer in the windows that lost a third (kvlab serve's own step
profile, docs/validation.md). So the benchmark records it, `calibrate --from-bench` fits how
much it slows the server (`host_steal_slowdown`), and `validate --base-url` slows each window
by its own. Linux only (/proc/stat); elsewhere nothing is recorded.
"""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal (guest times are
# already counted in user and nice)
STEAL_FIELD = 7
NUM_FIELDS = 8


def host_cpu_times(path: Path = PROC_STAT) -> tuple[float, float] | None:
    """(steal, total) CPU time of the host's CPUs together since boot, in clock ticks; None
    where the kernel does not tell (not Linux, or an unreadable file)."""
    try:
        with path.open() as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < NUM_FIELDS + 1 or fields[0] != "cpu":
        return None
    try:
        ticks = [float(value) for value in fields[1:NUM_FIELDS + 1]]
    except ValueError:
        return None
    return ticks[STEAL_FIELD], sum(ticks)


def ticks_between(steal: list[float], total: list[float]) -> tuple[float, float] | None:
    """(steal, total) ticks between the first and the last sample of the cumulative `steal`
    and `total` series (NaN samples skipped); None without two samples or time between
    them."""
    pairs = [(s, t) for s, t in zip(steal, total, strict=True) if s == s and t == t]
    if len(pairs) < 2 or not pairs[-1][1] > pairs[0][1]:
        return None
    return pairs[-1][0] - pairs[0][0], pairs[-1][1] - pairs[0][1]


def steal_perc(steal: list[float], total: list[float]) -> float | None:
    """The steal share, in percent, of the CPU time `ticks_between` the samples; None where
    it gives none."""
    ticks = ticks_between(steal, total)
    return None if ticks is None else 100.0 * ticks[0] / ticks[1]
