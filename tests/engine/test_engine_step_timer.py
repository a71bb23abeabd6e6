"""How the engine measures a step: wall time by default, or the engine thread's CPU time."""

from __future__ import annotations

import time

import pytest

from kvlab.engine.engine import _step_timer
from kvlab.errors import KvlabError


def test_wall_is_the_default_timer():
    assert _step_timer("wall", "cpu") is time.perf_counter


def test_cpu_timer_reads_the_thread_cpu_time():
    assert _step_timer("cpu", "cpu") is time.thread_time


def test_cpu_timer_is_refused_where_the_work_runs_on_a_device():
    with pytest.raises(KvlabError, match="step_timer wall"):
        _step_timer("cpu", "cuda")


def test_unknown_timer_lists_the_choices():
    with pytest.raises(KvlabError, match="wall, cpu"):
        _step_timer("gpu", "cpu")


def test_a_cpu_timed_run_records_positive_step_times(tmp_path, capsys):
    from kvlab.cli import main

    code = main(
        [
            "run",
            "--num-prompts",
            "3",
            "--step-timer",
            "cpu",
            "--num-gpu-blocks-override",
            "64",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "r.json",
            "--disable-tqdm",
        ]
    )
    assert code == 0
    import csv

    with open(tmp_path / "r.steps.csv") as steps:
        rows = list(csv.DictReader(steps))
    assert rows and all(float(row["wall_time_s"]) > 0 for row in rows)
