"""The client host's steal time: /proc/stat read, the share over a run, and the warnings
`calibrate --from-bench` and `validate --base-url` give where the hypervisor withheld more
than 5% of the host's CPU."""

from __future__ import annotations

import math

import pytest

from kvlab.bench.host_cpu import host_cpu_times, steal_perc, ticks_between
from kvlab.fidelity.from_bench import steal_warnings
from kvlab.fidelity.server_pooling import pooled_steal_perc

STAT = "cpu  100 5 40 800 10 1 2 42 0 0\ncpu0 50 2 20 400 5 0 1 21 0 0\nintr 1\n"


def test_the_cpu_line_gives_steal_and_total_ticks(tmp_path):
    path = tmp_path / "stat"
    path.write_text(STAT)
    assert host_cpu_times(path) == (42.0, 100 + 5 + 40 + 800 + 10 + 1 + 2 + 42)


@pytest.mark.parametrize("text", ["", "intr 1 2 3\n", "cpu 1 2 three 4 5 6 7 8\n", "cpu 1 2\n"])
def test_a_file_that_does_not_tell_gives_none(tmp_path, text):
    path = tmp_path / "stat"
    path.write_text(text)
    assert host_cpu_times(path) is None
    assert host_cpu_times(tmp_path / "missing") is None


def test_the_steal_share_is_taken_between_the_first_and_last_samples():
    assert steal_perc([10.0, 30.0, 60.0], [1000.0, 1100.0, 1200.0]) == pytest.approx(25.0)
    assert steal_perc([10.0, math.nan, 60.0], [1000.0, math.nan, 1200.0]) == pytest.approx(25.0)
    assert steal_perc([10.0], [1000.0]) is None
    assert steal_perc([10.0, 10.0], [1000.0, 1000.0]) is None


class _Run:
    """A bench result's host CPU columns only."""

    def __init__(self, steal: list[float], total: list[float]) -> None:
        self.host_cpu = {"time_s": [float(i) for i in range(len(steal))],
                         "steal_ticks": steal, "total_ticks": total}

    def host_cpu_ticks(self) -> tuple[float, float] | None:
        return ticks_between(self.host_cpu["steal_ticks"], self.host_cpu["total_ticks"])

    def host_cpu_steal_perc(self) -> float | None:
        return steal_perc(self.host_cpu["steal_ticks"], self.host_cpu["total_ticks"])


def test_runs_that_lost_over_5_percent_are_warned_of_by_number():
    quiet, busy = _Run([0.0, 4.0], [0.0, 100.0]), _Run([0.0, 33.0], [0.0, 100.0])
    (warning,) = steal_warnings([quiet, busy, _Run([], [])], "window", 2.0)
    assert warning.startswith("window 2: the hypervisor withheld 33.0% of this machine's CPU")
    assert warning.endswith("simulated 1.66x slower (host_steal_slowdown 2)")
    (unknown,) = steal_warnings([busy], "calibration run", 0.0)
    assert "could not tell" in unknown
    assert pooled_steal_perc([quiet, busy]) == pytest.approx(18.5)
    assert pooled_steal_perc([quiet, _Run([], [])]) is None


def test_repeated_windows_are_warned_of_by_window_and_run():
    from kvlab.fidelity.server_validation import _run_labels

    quiet, busy = _Run([0.0, 4.0], [0.0, 100.0]), _Run([0.0, 33.0], [0.0, 100.0])
    labels = _run_labels(num_windows=2, num_repeats=2)
    assert labels == ["window 1, run 1", "window 1, run 2", "window 2, run 1", "window 2, run 2"]
    (warning,) = steal_warnings([quiet, quiet, busy, quiet], "window", 2.0, labels=labels)
    assert warning.startswith("window 2, run 1: the hypervisor withheld 33.0%")
    assert _run_labels(num_windows=2, num_repeats=1) == ["window 1", "window 2"]
