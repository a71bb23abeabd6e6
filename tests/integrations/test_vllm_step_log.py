"""The plugin's step log (KVLAB_VLLM_STEP_LOG) on a stand-in for vLLM's V1 Scheduler, and
kvlab's reading of it (kvlab.fidelity.step_log): the rows of one run picked by its request-id
prefix, and errors that name the file, line or flag."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from kvlab.errors import KvlabError
from kvlab.fidelity.kv_alignment import compare_changes
from kvlab.fidelity.kv_lockstep import format_kv_lockstep
from kvlab.fidelity.step_log import (
    EngineClockRun,
    ScheduleLog,
    check_covers,
    match_schedule,
    read_schedule_log,
    replay_on_engine_clock,
    step_log_file,
)
from kvlab.integrations.vllm.step_log import StepLogWriter, install_step_log
from kvlab.traces.types import Trace, TraceRequest


@dataclass
class _Output:
    num_scheduled_tokens: dict[str, int]


@dataclass
class _Scheduler:
    """What the log reads of vLLM's Scheduler: the three methods and the step's state."""

    plan: list[dict[str, int]]
    current_step: int = 0
    waiting: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    kv_cache_manager: object = field(default_factory=lambda: SimpleNamespace(
        block_pool=SimpleNamespace(get_num_free_blocks=lambda: 7)))

    def add_request(self, request):
        self.added.append(request.request_id)

    def schedule(self):
        self.current_step += 1
        return _Output(self.plan.pop(0) if self.plan else {})

    def _preempt_request(self, request, timestamp):
        return request.request_id


def _request(request_id: str, prompt_len: int = 4):
    return SimpleNamespace(request_id=request_id, num_prompt_tokens=prompt_len)


@pytest.fixture
def logged(tmp_path):
    """A stand-in Scheduler class wrapped by the plugin, writing to tmp_path/steps.<pid>."""

    class Scheduler(_Scheduler):
        pass

    install_step_log(Scheduler, StepLogWriter(str(tmp_path / "steps")))
    install_step_log(Scheduler, StepLogWriter(str(tmp_path / "other")))  # (idempotent)
    return Scheduler, tmp_path / "steps"


def test_the_log_is_the_schedulers_own_steps_changing_nothing(logged):
    scheduler_cls, stem = logged
    ours, other = "cmpl-run-a-{}-0-x", "cmpl-run-a-b-{}-0-x"  # (a run whose prefix holds ours)
    scheduler = scheduler_cls(plan=[{ours.format(0): 4, other.format(0): 4}, {},
                                    {ours.format(0): 1, ours.format(1): 3},
                                    {ours.format(1): 1}])
    for request in (_request(ours.format(0)), _request(other.format(0)),
                    _request(ours.format(1), 3)):
        scheduler.add_request(request)
    outputs = [scheduler.schedule() for _ in range(4)]
    assert scheduler._preempt_request(_request(ours.format(1)), 0.0) == ours.format(1)
    assert scheduler.added == [ours.format(0), other.format(0), ours.format(1)]  # (unchanged)
    assert outputs[1].num_scheduled_tokens == {}
    assert step_log_file(stem) == stem.parent / f"steps.{os.getpid()}"
    assert not list(stem.parent.glob("other.*"))  # (wrapped once; nothing written elsewhere)
    log = read_schedule_log(stem, "run-a-")
    assert log.arrivals == [0, 1]
    # a step holding another run's request is not this run's; an empty step is not logged
    assert log.steps == [{0: 1, 1: 3}, {1: 1}]
    assert log.preemptions == [(4, 1)]
    assert log.preemptions_per_request() == {1: 1}
    assert log.step_times_s == sorted(log.step_times_s)
    assert read_schedule_log(stem, "run-a-b-").steps == []  # (its step held ours too)
    assert read_schedule_log(stem, "run-a-b-").arrivals == [0]


def test_a_missing_log_says_how_to_make_one(tmp_path):
    with pytest.raises(KvlabError, match=r"--step-log .*no log .*KVLAB_VLLM_STEP_LOG="):
        step_log_file(tmp_path / "steps")
    (tmp_path / "steps.12").write_text("")  # (a process that never scheduled)
    with pytest.raises(KvlabError, match="no log"):
        step_log_file(tmp_path / "steps")


def test_two_engines_logs_ask_for_one_and_a_file_is_taken_as_is(tmp_path):
    for pid in (12, 13):
        (tmp_path / f"steps.{pid}").write_text('{"t": 0.0, "add": "x", "prompt_len": 1}\n')
    with pytest.raises(KvlabError, match=r"several logs .*steps\.12.*steps\.13"):
        step_log_file(tmp_path / "steps")
    assert step_log_file(tmp_path / "steps.13") == tmp_path / "steps.13"


def test_a_row_that_is_not_the_logs_names_its_file_and_line(tmp_path):
    path = tmp_path / "steps.5"
    path.write_text('{"t": 1.0, "add": "cmpl-p-0-0", "prompt_len": 2}\n'
                    'cmpl-p-1 truncated\n')
    with pytest.raises(KvlabError, match=rf"{path}:2: not a row of kvlab's step log"):
        read_schedule_log(tmp_path / "steps", "p-")


def test_the_engine_clock_replay_needs_every_completed_request_of_the_run(tmp_path):
    path = tmp_path / "steps.5"
    path.write_text('{"t": 10.0, "add": "cmpl-p-0-0", "prompt_len": 2}\n'
                    '{"t": 10.5, "step": 1, "tokens": {"cmpl-p-0-0": 2}, "waiting": 0, '
                    '"free": 3}\n'
                    '{"t": 10.75, "step": 2, "tokens": {"cmpl-p-0-0": 1}, "waiting": 0, '
                    '"free": 3}\n')
    log = read_schedule_log(path, "p-")
    served = SimpleNamespace(requests=[SimpleNamespace(request_id=0, completed=True),
                                       SimpleNamespace(request_id=1, completed=True)])
    with pytest.raises(KvlabError, match=r"names 1 of the run's 2 completed requests \(not "
                                         r"\[1\]\)"):
        check_covers(log, served)
    served.requests[1].completed = False  # (refused by the server's API: never queued)
    check_covers(log, served)
    trace = Trace("t", "random", "synthetic",
                  [TraceRequest(0, 5.0, 2, 1), TraceRequest(1, 5.1, 2, 1)])
    replay, durations = replay_on_engine_clock(trace, log)
    # (queued before the first step: it arrives at it; each step lasts until the next)
    assert [(r.request_id, r.arrival_s) for r in replay.requests] == [(0, 0.0)]
    assert durations == [0.25, 1e-3]
    with pytest.raises(KvlabError, match=r"no step of requests named q-<id>"):
        replay_on_engine_clock(trace, read_schedule_log(path, "q-"))


def test_the_schedule_is_compared_step_for_step_and_reported():
    log = ScheduleLog(steps=[{0: 4}, {0: 1, 1: 3}, {1: 1}], preemptions=[(2, 1)])
    alike = EngineClockRun([], [{0: 4}, {0: 1, 1: 3}, {1: 1}], {1: 1}, 3)
    match = match_schedule(alike, log)
    assert match.identical and match.first_difference is None
    other = EngineClockRun([], [{0: 4}, {0: 1, 1: 2}, {1: 2}], {}, 3)
    match = match_schedule(other, log)
    assert (match.first_difference, match.preemptions_equal, match.identical) == (1, False, False)
    report = compare_changes([], [])
    report.schedule = match
    text = format_kv_lockstep(report)
    rows = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    assert rows["Steps vLLM / kvlab (its clock)"].strip() == "3 / 3"
    assert rows["Steps alike before the first other"].strip() == "1 (step 1 differs)"
    assert rows["Preemptions per request alike"].strip() == "no (1 / 0)"
    assert "Every step scheduled" not in text
    assert report.to_json()["schedule"] == {
        "num_vllm_steps": 3, "num_kvlab_steps": 3, "first_difference": 1,
        "num_vllm_preemptions": 1, "num_kvlab_preemptions": 0, "preemptions_equal": False,
        "identical": False}
    report.schedule = match_schedule(alike, log)
    assert "Every step scheduled as vLLM's, every preemption too." in format_kv_lockstep(report)
