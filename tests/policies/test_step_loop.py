"""The step loop both worlds run: the time rule, records, and the one livelock guard."""

from __future__ import annotations

import pytest

from kvlab.policies import (
    KVCacheManager,
    LivelockError,
    MemOps,
    Request,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StepLoop,
)


class StuckScheduler(Scheduler):
    """A scheduler that never decides anything although a request waits (a bug to catch)."""

    def schedule(self, now_s: float = 0.0) -> SchedulerOutput:
        self.step_id += 1
        return SchedulerOutput(step_id=self.step_id - 1, mem_ops=MemOps())


def _scheduler(kind: type[Scheduler] = Scheduler) -> Scheduler:
    manager = KVCacheManager("paged:block_size=4", 16, max_model_len=64)
    return kind(SchedulerConfig(max_model_len=64, max_num_batched_tokens=64), manager)


def test_a_step_that_decides_nothing_while_requests_wait_is_a_livelock_error():
    loop = StepLoop(_scheduler(StuckScheduler), [Request(0, 10, 2)])
    assert loop.admit(0.0)
    with pytest.raises(LivelockError, match=r"livelock at t=0\.000000s, step 0: .* 1 waiting"):
        loop.schedule(0.0)


def test_requests_are_admitted_when_the_clock_reaches_their_arrival():
    loop = StepLoop(_scheduler(), [Request(0, 8, 1, arrival_s=0.5), Request(1, 8, 1)])
    assert loop.admit(0.0)
    assert [r.request_id for r in loop.scheduler.waiting] == [1]
    assert loop.next_arrival_s() == 0.5


def test_each_committed_step_is_one_row_recorded_before_its_tokens_commit():
    loop = StepLoop(_scheduler(), [Request(0, 8, 2)])
    now = 0.0
    while loop.has_work():
        assert loop.admit(now)
        output = loop.schedule(now)
        loop.commit(output, start_s=now, end_s=now + 0.25, wall_time_s=0.1)
        now += 0.25
    columns = loop.steps.columns
    assert list(columns["step_id"]) == [0, 1]
    assert list(columns["start_s"]) == [0.0, 0.25]
    assert list(columns["duration_s"]) == [0.25, 0.25]
    assert list(columns["wall_time_s"]) == [0.1, 0.1]
    assert list(columns["num_prefill_tokens"]) == [8, 0]
    assert list(columns["num_running"]) == [1, 1]  # counted before the step's commit
    assert list(columns["num_used_pages"]) == [2, 3]  # the prompt, then its first decode
