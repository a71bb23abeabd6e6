"""The step loop both worlds run: admit -> schedule -> progress check -> record -> update.

The simulator's SimPy process and the engine (offline, replay, server) drive one `StepLoop`
each and only carry out the step in between: the simulator charges its time, the engine runs
the model. So the two make the same decisions in the same order by construction
(docs/architecture.md, "The serving core"), and a step that decides nothing is caught here,
once, for both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvlab.metrics import INT_COLUMNS, StepCounts, StepRecorder
from kvlab.policies.arrival_queue import ArrivalQueue
from kvlab.policies.manager import DecodeAhead
from kvlab.policies.outputs import MemoryUsage, SchedulerOutput
from kvlab.policies.request import Request
from kvlab.policies.scheduler import Scheduler


class LivelockError(RuntimeError):
    """A step that decided nothing while requests were left: a scheduler or policy bug."""


class StepLoop:
    """One instance's requests yet to arrive, its scheduler and its per-step records.

    Time follows the rule of docs/architecture.md: a step starting at clock time t first admits
    every request with arrival <= t (`admit`); with nothing to run, the clock jumps to
    `next_arrival_s()`.
    `schedule(t)` decides the step; the executor carries it out and calls `commit` with the
    step's end time, which records the step and commits its tokens.
    """

    __slots__ = ("_usage", "arrivals", "scheduler", "steps")

    def __init__(self, scheduler: Scheduler, requests: Iterable[Request]) -> None:
        self.scheduler = scheduler
        self.arrivals = ArrivalQueue(requests)
        self.steps = StepRecorder()
        self._usage: MemoryUsage | None = None  # memory after the last step's decisions

    def has_work(self) -> bool:
        """True while a request is yet to arrive, or waiting, running or swapped out."""
        return bool(len(self.arrivals)) or self.scheduler.has_unfinished()

    def admit(self, now_s: float) -> bool:
        """Hand the scheduler every request arrived by `now_s`; True when a step can run."""
        self.arrivals.admit_until(now_s, self.scheduler)
        return self.scheduler.has_unfinished()

    def submit(self, request: Request) -> None:
        """A request arriving now, after every one given so far (a live server's)."""
        self.arrivals.push(request)

    def next_arrival_s(self) -> float | None:
        """When the next request arrives (None when all have)."""
        return self.arrivals.next_arrival_s()

    def schedule(self, now_s: float) -> SchedulerOutput:
        """Decide the step starting at `now_s`; raises LivelockError when it decides nothing."""
        scheduler = self.scheduler
        output = scheduler.schedule(now_s)
        if not (output.requests or output.mem_ops or output.preempted or output.failed):
            raise LivelockError(_livelock_message(scheduler, now_s))
        manager = scheduler.manager
        self._usage = manager.usage()
        if manager.precision is not None:  # (its pages spared, as the usage is taken)
            manager.precision.note_usage(output.requests)
        return output

    def commit(
        self,
        output: SchedulerOutput,
        *,
        start_s: float,
        end_s: float,
        wall_time_s: float,
        sampled_token_ids: Sequence[int | None] | None = None,
        stopped: set[int] | frozenset[int] = frozenset(),
    ) -> list[Request]:
        """Record the step that ran from `start_s` to `end_s` (measured: `wall_time_s`), then
        commit its tokens (stamped `end_s`); returns the requests it finished."""
        scheduler = self.scheduler
        usage, ops = self._usage, output.mem_ops
        assert usage is not None, "commit a step that schedule() decided"
        # one tuple, in field order, made a StepCounts without a call per field (keywords
        # cost 1.3 us a step, 5% of a simulation; even a positional call 0.4 us)
        counts: StepCounts = tuple.__new__(StepCounts, (
            output.step_id,
            len(output.requests),  # num_seqs
            output.num_prefill_tokens,
            output.num_decode_tokens,
            output.num_context_tokens,
            output.num_attention_pairs,
            output.num_padded_context_tokens,
            len(scheduler.running),  # num_running
            len(scheduler.waiting),  # num_waiting
            len(scheduler.swapped),  # num_swapped
            len(output.preempted),  # num_preempted
            len(ops.swap_outs),  # num_swap_out_pages
            len(ops.swap_ins),  # num_swap_in_pages
            ops.num_swap_out_transfers,
            ops.num_swap_in_transfers,
            len(ops.copies),  # num_copied_pages
            usage.num_used_pages,
            usage.num_cached_free_pages,
            usage.num_free_pages,
            usage.num_live_token_slots,
            usage.num_internal_frag_slots,
            usage.num_external_frag_pages,
            usage.num_host_used_pages,
        ))
        self.steps.append(start_s, end_s - start_s, wall_time_s, counts)
        return scheduler.update(output, sampled_token_ids, end_s, stopped)


    def commit_decode_run(self, starts_s: list[float], ends_s: Sequence[float],
                          ahead: DecodeAhead) -> list[Request]:
        """Schedule, record and commit the steps from `starts_s[j]` to `ends_s[j]` as plain
        decodes of the running batch, as `Scheduler.plan_decode_run` planned them (`ahead`):
        the rows and tokens that `schedule` and `commit` step by step would give. Returns the
        requests the last step finished."""
        scheduler = self.scheduler
        usage = scheduler.manager.usage()  # before the run's first step
        run = scheduler.advance_decode_run(ends_s, ahead)
        num_steps, num_seqs, page_size = len(ends_s), run.num_seqs, usage.page_size
        contexts, padded = run.context_columns(num_steps)
        used = [usage.num_used_pages + taken for taken in run.pages_taken]
        live = list(range(usage.num_live_token_slots + num_seqs,
                          usage.num_live_token_slots + num_seqs * (num_steps + 1), num_seqs))
        seqs, zeros = [num_seqs] * num_steps, [0] * num_steps  # (columns are copied in)
        columns = dict.fromkeys(INT_COLUMNS, zeros)  # (then the ones a decode run changes)
        columns.update(
            step_id=list(range(run.first_step_id, run.first_step_id + num_steps)),
            num_seqs=seqs,
            num_decode_tokens=seqs,
            num_context_tokens=list(contexts),
            num_padded_context_tokens=list(padded),
            num_running=seqs,
            num_used_pages=used,
            num_cached_free_pages=[usage.num_cached_free_pages] * num_steps,
            num_free_pages=_free_pages(usage.num_free_pages, run.pages_taken,
                                       ahead.pages_released),
            num_live_token_slots=live,
            num_internal_frag_slots=[u * page_size - slots
                                     for u, slots in zip(used, live, strict=True)],
            num_external_frag_pages=[usage.num_external_frag_pages] * num_steps,
            num_host_used_pages=[usage.num_host_used_pages] * num_steps,
        )
        self.steps.extend_columns(
            starts_s, [end - start for start, end in zip(starts_s, ends_s, strict=True)], columns)
        return run.finished


def _free_pages(num_free: int, pages_taken: list[int], released: list[int] | None
                ) -> list[int]:
    """The free pages after each step of a decode run: `num_free` before it, less the pages
    taken, plus any a precision ledger released (each cumulated)."""
    if not released or not released[-1]:
        return [num_free - taken for taken in pages_taken]
    return [num_free - taken + back for taken, back in zip(pages_taken, released, strict=True)]


def _livelock_message(scheduler: Scheduler, now_s: float) -> str:
    def head(queue: Sequence[Request]) -> str:
        if not queue:
            return "none"
        return f"request {queue[0].request_id} ({queue[0].num_tokens} tokens)"

    usage = scheduler.manager.usage()
    return (
        f"livelock at t={now_s:.6f}s, step {scheduler.step_id - 1}: nothing scheduled, preempted "
        f"or failed with {len(scheduler.running)} running, {len(scheduler.waiting)} waiting "
        f"(head: {head(scheduler.waiting)}), {len(scheduler.swapped)} swapped "
        f"(head: {head(scheduler.swapped)}); {usage.num_free_pages} free, "
        f"{usage.num_cached_free_pages} cached-free of {usage.num_total_pages} pages"
    )
