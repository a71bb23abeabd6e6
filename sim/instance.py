"""One serving instance as a SimPy process that advances one engine step at a time.

It drives a StepLoop exactly as the engine's virtual clock does (docs/architecture.md, "Time,
the same in both worlds"): a step starting at clock t admits every request with arrival <= t,
schedules, lasts its memory work plus its forward pass, and stamps its tokens at its end; with
nothing running, waiting or swapped the instance sleeps until the arrival process wakes it at
the next arrival. Lockstep validation replays an engine's step durations through this loop,
so the order of calls here is part of the contract: one `cost_model.step_time_s(output)` per
step, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from kvlab.policies import Scheduler, SchedulerOutput, StepLoop
from kvlab.sim.cost_model import CostModel
from kvlab.sim.link import HostLink


class SimInstance:
    """The engine-step process of one instance: a `StepLoop` whose steps cost simulated time."""

    def __init__(
        self,
        env: simpy.Environment,
        loop: StepLoop,
        cost_model: CostModel,
        link: HostLink,
        *,
        on_finished: Callable[[int], None] | None = None,
    ) -> None:
        self.env = env
        self.loop = loop
        self.cost_model = cost_model
        self.link = link
        self.on_finished = on_finished  # called with the number of requests a step ended
        self._wake: simpy.Event | None = None

    @property
    def scheduler(self) -> Scheduler:
        """The instance's scheduler."""
        return self.loop.scheduler

    def wake(self) -> None:
        """Called by the arrival process: resume the instance if it sleeps for want of work."""
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def run(self) -> Generator[simpy.Event, Any, None]:
        """SimPy process body: step until every request of the trace has finished."""
        env, loop = self.env, self.loop
        while True:
            now = env.now
            if not loop.admit(now):
                if loop.next_arrival_s() is None:
                    return
                self._wake = env.event()
                yield self._wake
                continue
            output = loop.schedule(now)
            yield from self._execute(output, now)

    def _execute(
        self, output: SchedulerOutput, start_s: float
    ) -> Generator[simpy.Event, Any, None]:
        """Charge the step's time, then commit it at its end."""
        env, cost_model = self.env, self.cost_model
        ops = output.mem_ops
        device_s = cost_model.step_time_s(output)
        if ops:
            device_s += cost_model.copy_time_s(len(ops.copies))
            link_s = self.link.swap_time_s(ops)
            if link_s > 0.0:
                yield from self.link.transfer(ops, link_s)
        yield env.timeout(device_s)
        end_s = env.now
        # wall time as the engine's virtual clock records it: the step's whole span
        finished = self.loop.commit(
            output, start_s=start_s, end_s=end_s, wall_time_s=end_s - start_s
        )
        if self.on_finished is not None and (finished or output.failed):
            self.on_finished(len(finished) + len(output.failed))
