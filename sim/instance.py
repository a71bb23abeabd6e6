"""One serving instance as a SimPy process that advances one engine step at a time.

It drives a StepLoop exactly as the engine's virtual clock does (docs/architecture.md, "Time,
the same in both worlds"): a step starting at clock t admits every request with arrival <= t,
schedules, lasts its memory work plus its forward pass, and stamps its tokens at its end; with
nothing running, waiting or swapped the instance sleeps until the next arrival (alone, by a
timeout to it; in a cluster, until the router wakes it). Lockstep validation replays an
engine's step durations through this loop, so the order of calls here is part of the
contract: one `cost_model.step_time_s(output)` per step, in order.

The fast path: where the running batch would take several steps of nothing but its own decodes
(no arrival before their start, nothing waiting or swapped, nobody finishing before the last
of them, pages from the free list: `Scheduler.plan_decode_run`), those steps are timed one by
one and committed at once (`StepLoop.commit_decode_run`), with exactly the records, stamps
and pages that stepping would give (tests/sim/test_decode_runs.py compares the two on whole
traces). Most steps of a
simulation are such steps; committing them together removes the Python work per token.

Alone, an instance's requests are all in its StepLoop from the start, and the next of them is
the horizon a decode run stops at, and the time an idle instance sleeps to (no arrival
process: one SimPy event per idle spell, none per request). In a cluster (`kvlab.sim.cluster`)
requests are routed to an instance only as they arrive, so any arrival of the whole cluster may
join this instance's batch: an `ArrivalSource` then tells the instance when the next one is,
and hands over (routes) every request arrived by the time a step starts.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

import simpy

from kvlab.policies import Request, Scheduler, SchedulerOutput, StepLoop
from kvlab.policies.decode_run import decode_contexts
from kvlab.policies.manager import DecodeAhead
from kvlab.sim.arrival_process import delay_until
from kvlab.sim.cost_model import CostModel, StepShape, decode_step_timer
from kvlab.sim.group_memory import group_memory_of
from kvlab.sim.link import HostLink, TierLinks, wait_until
from kvlab.sim.precision_costs import demoted_run_timer, precision_step_time_s

MAX_DECODE_RUN = 256  # steps planned at once on the fast path (bounds the lists it builds)


@dataclass(slots=True)
class DecodeStepShape(StepShape):
    """The shape of a fast-path step, with its id, as the scheduler's output of it has."""

    step_id: int = 0


class ArrivalSource(Protocol):
    """Where an instance's requests come from when they are not all in its StepLoop from the
    start (a cluster's router)."""

    def next_arrival_s(self) -> float | None:
        """When the next request that may join this instance arrives (None: no more will)."""
        ...

    def deliver_until(self, now_s: float) -> None:
        """Hand every request arrived by `now_s` to its instance's StepLoop (`submit`)."""
        ...


class SimInstance:
    """The engine-step process of one instance: a `StepLoop` whose steps cost simulated time.

    `arrivals` None: the StepLoop holds every request from the start (one instance alone).
    """

    def __init__(
        self,
        env: simpy.Environment,
        loop: StepLoop,
        cost_model: CostModel,
        link: HostLink,
        *,
        on_finished: Callable[[list[Request]], None] | None = None,
        decode_runs: bool = True,
        tier_links: TierLinks | None = None,
        arrivals: ArrivalSource | None = None,
    ) -> None:
        self.env = env
        self.loop = loop
        self.cost_model = cost_model
        self.link = link
        self.tier_links = tier_links  # the links to the memory tiers (None: no tiers)
        # called with the requests a step finished or failed (a progress bar; a cluster's
        # prefill instances hand them on)
        self.on_finished = on_finished
        # when the step (or decode run) under way ends; None between steps
        self.step_end_s: float | None = None
        self.decode_runs = decode_runs  # take the fast path (False: every step one by one)
        self._wake: simpy.Event | None = None
        # Alone: the loop's own next arrival, and nothing to hand over (None keeps a step's
        # work what it was before clusters).
        self._next_arrival_s: Callable[[], float | None] = (
            loop.next_arrival_s if arrivals is None else arrivals.next_arrival_s)
        self._deliver_until: Callable[[float], None] | None = (
            None if arrivals is None else arrivals.deliver_until)
        # the cost model's decode-step timer (None: one shape per step), resolved once
        self._decode_step_time = decode_step_timer(cost_model)
        # pages per KV-cache group of a hybrid model's manager (None: one group)
        self.group_memory = group_memory_of(loop.scheduler.manager)

    @property
    def scheduler(self) -> Scheduler:
        """The instance's scheduler."""
        return self.loop.scheduler

    def wake(self) -> None:
        """Called by a router (or a prefill instance handing work over): resume the instance
        if it sleeps for want of work. Alone, an instance sleeps until its own next arrival
        and needs no waking."""
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def run(self) -> Generator[simpy.Event, Any, None]:
        """SimPy process body: step until every request of the trace has finished."""
        env, loop = self.env, self.loop
        deliver_until = self._deliver_until
        while True:
            now = env.now
            if deliver_until is not None:
                # before admitting: an arrival at exactly `now` is routed even where this
                # instance's step end comes before the arrival process in SimPy's event order
                deliver_until(now)
            if not loop.admit(now):
                next_arrival = self._next_arrival_s()
                if next_arrival is None:
                    return
                if deliver_until is None:  # alone: the next arrival is this loop's own
                    yield env.timeout(delay_until(now, next_arrival))
                else:
                    self._wake = env.event()
                    yield self._wake
                continue
            plan = self._plan_decode_run(now) if self.decode_runs else None
            if plan is not None:
                yield from self._run_decodes(now, *plan)
                continue
            output = loop.schedule(now)
            if self.group_memory is not None:
                self.group_memory.sample()
            yield from self._execute(output, now)

    def _plan_decode_run(self, now_s: float
                         ) -> tuple[list[float], list[float], DecodeAhead] | None:
        """The durations and the end times of the decode-only steps the batch takes from
        `now_s` until an arrival would join it, and the scheduler's plan of them (None where
        fewer than two could run: stepping costs the same). Each end is the previous plus the
        step's duration, as SimPy's clock adds them."""
        scheduler = self.loop.scheduler
        ahead = scheduler.plan_decode_run(MAX_DECODE_RUN)
        if ahead is None:
            return None
        next_arrival = self._next_arrival_s()  # alone: the loop's; in a cluster: any
        horizon = float("inf") if next_arrival is None else next_arrival
        num_seqs = len(ahead.states)
        durations: list[float] = []
        ends: list[float] = []
        time_s = now_s
        contexts, paddeds = decode_contexts(num_seqs, ahead.sum_computed, ahead.max_computed,
                                            ahead.num_steps)
        decode_step_time = self._decode_step_time
        timer = (self._shape_timer(num_seqs, scheduler.step_id) if decode_step_time is None
                 else decode_step_time(num_seqs))
        precision = scheduler.manager.precision
        if precision is not None and precision.run is not None:  # (precision_costs.py)
            timer = demoted_run_timer(timer, precision.run, self.cost_model.requantize_time_s,
                                      self.cost_model.demoted_read_time_s)
        for step, context, padded in zip(range(ahead.num_steps), contexts, paddeds, strict=True):
            if step and time_s >= horizon:  # a step starting here admits the arrival first
                break
            duration = timer(context, padded)
            durations.append(duration)
            time_s = time_s + duration
            ends.append(time_s)
        return durations, ends, ahead  # the cost model timed these steps: they run here

    def _shape_timer(self, num_seqs: int, first_step_id: int) -> Callable[[int, int], float]:
        """`step_time_s` of the run's steps in turn, given each one's context and padded
        context, for a cost model without its own decode timer: one shape, its changing
        fields set for each step (a cost model reads a shape only while it is called)."""
        step_time_s = self.cost_model.step_time_s
        shape = DecodeStepShape(0, num_seqs, 0, num_seqs, 0, 0, first_step_id - 1)

        def time_s(num_context: int, num_padded: int) -> float:
            shape.num_context_tokens, shape.num_padded_context_tokens = num_context, num_padded
            shape.step_id += 1
            return step_time_s(shape)

        return time_s

    def _run_decodes(self, now_s: float, durations: list[float], ends_s: list[float],
                     ahead: DecodeAhead) -> Generator[simpy.Event, Any, None]:
        """Carry out a planned decode run, then commit it. Alone, nothing else acts on this
        instance or reads its clock before the run ends, so one timeout to the last end serves
        where SimPy reaches it exactly; otherwise one timeout per step, as stepping. (Tier
        writes in flight do not change that: they only hold their links, and the run starts
        none, so each of them still ends before a step that ends at the same time.)"""
        env, end_s = self.env, ends_s[-1]
        self.step_end_s = end_s
        alone = self._deliver_until is None
        delay = delay_until(now_s, end_s) if alone else None
        if delay is not None and now_s + delay == end_s:
            yield env.timeout(delay)
        else:
            for duration in durations:
                yield env.timeout(duration)
        self.step_end_s = None
        if self.group_memory is not None:
            # (a hybrid manager plans no decode runs today; if one does, its pages at the start)
            self.group_memory.sample()
            self.group_memory.record(end_s - now_s)
        finished = self.loop.commit_decode_run([now_s, *ends_s[:-1]], ends_s, ahead)
        if self.on_finished is not None and finished:
            self.on_finished(finished)

    def _execute(
        self, output: SchedulerOutput, start_s: float
    ) -> Generator[simpy.Event, Any, None]:
        """Charge the step's time, then commit it at its end."""
        env, cost_model = self.env, self.cost_model
        ops = output.mem_ops
        precision = self.loop.scheduler.manager.precision
        if precision is None:
            device_s = cost_model.step_time_s(output)
        else:
            device_s = precision_step_time_s(cost_model, output, precision)
        if ops:
            device_s += cost_model.copy_time_s(len(ops.copies))
            link_s = self.link.swap_time_s(ops)
            swapped_s = self.link.reserve(ops, link_s) if link_s > 0.0 else None
            tiers = self.tier_links
            if tiers is not None and ops.tier_writes:
                # now, behind the swaps on a shared link: they read pages this step overwrites
                tiers.start_writes(ops)
            if swapped_s is not None:
                yield wait_until(env, swapped_s)
            if tiers is not None and ops.tier_loads:
                device_s = yield from tiers.load(ops, device_s)
        self.step_end_s = env.now + device_s
        yield env.timeout(device_s)
        self.step_end_s = None
        end_s = env.now
        # wall time as the engine's virtual clock records it: the step's whole span
        finished = self.loop.commit(
            output, start_s=start_s, end_s=end_s, wall_time_s=end_s - start_s
        )
        if self.group_memory is not None:
            self.group_memory.record(end_s - start_s)
        if self.on_finished is not None and (finished or output.failed):
            self.on_finished(finished + output.failed)
