"""One serving instance as a SimPy process that advances one engine step at a time.

It drives the scheduler exactly as the engine's virtual clock does (DESIGN "Time, the same in
both worlds"): a step starting at clock t admits every request with arrival <= t, schedules,
lasts its memory work plus its forward pass, and stamps its tokens at its end; with nothing
running, waiting or swapped the instance sleeps until the arrival process wakes it at the next
arrival. Lockstep validation replays an engine's step durations through this loop, so the order
of calls here is part of the contract: one `cost_model.step_time_s(output)` per step, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from kvlab.policies import ArrivalQueue, Request, Scheduler, SchedulerOutput, StepRecorder
from kvlab.sim.cost_model import CostModel
from kvlab.sim.link import HostLink


class LivelockError(AssertionError):
    """A step that decided nothing while requests were left: a scheduler or policy bug."""


class SimInstance:
    """The engine-step process of one instance: scheduler, KV-cache manager, recorder, link."""

    def __init__(
        self,
        env: simpy.Environment,
        scheduler: Scheduler,
        arrivals: ArrivalQueue,
        cost_model: CostModel,
        link: HostLink,
        *,
        on_finished: Callable[[int], None] | None = None,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.arrivals = arrivals
        self.cost_model = cost_model
        self.link = link
        self.steps = StepRecorder()
        self.on_finished = on_finished  # called with the number of requests a step ended
        self._wake: simpy.Event | None = None

    def wake(self) -> None:
        """Called by the arrival process: resume the instance if it sleeps for want of work."""
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def run(self) -> Generator[simpy.Event, Any, None]:
        """SimPy process body: step until every request of the trace has finished."""
        env, scheduler, arrivals = self.env, self.scheduler, self.arrivals
        while True:
            now = env.now
            arrivals.admit_until(now, scheduler)
            if not scheduler.has_unfinished():
                if arrivals.next_arrival_s() is None:
                    return
                self._wake = env.event()
                yield self._wake
                continue
            output = scheduler.schedule(now)
            if not (output.requests or output.mem_ops or output.preempted or output.failed):
                raise LivelockError(_livelock_message(scheduler, now))
            yield from self._execute(output, now)

    def _execute(
        self, output: SchedulerOutput, start_s: float
    ) -> Generator[simpy.Event, Any, None]:
        """Charge the step's time, record it, then commit its tokens at its end."""
        env, scheduler, cost_model = self.env, self.scheduler, self.cost_model
        usage = scheduler.manager.usage()  # memory after the step's decisions
        ops = output.mem_ops
        device_s = cost_model.step_time_s(output)
        if ops:
            device_s += cost_model.copy_time_s(len(ops.copies))
            link_s = self.link.swap_time_s(ops)
            if link_s > 0.0:
                yield from self.link.transfer(ops, link_s)
        yield env.timeout(device_s)
        end_s = env.now
        duration_s = end_s - start_s  # as the engine's virtual clock records it
        self.steps.record(
            output,
            usage,
            start_s=start_s,
            duration_s=duration_s,
            wall_time_s=duration_s,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            num_swapped=len(scheduler.swapped),
        )
        finished = scheduler.update(output, None, end_s)
        if self.on_finished is not None and (finished or output.failed):
            self.on_finished(len(finished) + len(output.failed))


def _livelock_message(scheduler: Scheduler, now_s: float) -> str:
    def head(queue: Any) -> str:
        request: Request | None = queue[0] if queue else None
        if request is None:
            return "none"
        return f"request {request.request_id} ({request.num_tokens} tokens)"

    usage = scheduler.manager.usage()
    return (
        f"livelock at t={now_s:.6f}s, step {scheduler.step_id - 1}: nothing scheduled, preempted "
        f"or failed with {len(scheduler.running)} running, {len(scheduler.waiting)} waiting "
        f"(head: {head(scheduler.waiting)}), {len(scheduler.swapped)} swapped "
        f"(head: {head(scheduler.swapped)}); {usage.num_free_pages} free, "
        f"{usage.num_cached_free_pages} cached-free of {usage.num_total_pages} pages"
    )
