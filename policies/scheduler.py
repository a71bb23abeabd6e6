"""Continuous-batching scheduler shared by the simulator and the engine (torch-free)."""

from __future__ import annotations

import itertools
from array import array
from collections import deque
from collections.abc import Sequence

from kvlab.policies import registry
from kvlab.policies.decode_run import DecodeRun
from kvlab.policies.manager import DecodeAhead, KVCacheManager
from kvlab.policies.outputs import MemOps, SchedulerOutput
from kvlab.policies.request import Request, RequestStatus
from kvlab.policies.scheduler_config import SchedulerConfig
from kvlab.policies.scheduling.spec import make_order
from kvlab.policies.step_batch import StepBatch


class Scheduler:
    """Decides each step which requests run, how many tokens each computes, and who is preempted.

    Order of service: running requests (decodes and unfinished prefill chunks), then swapped
    requests (swap-in, oldest first), then waiting requests (first come, first served, or in the
    order of the config's `scheduling_policy`; `priority` orders swapped requests too and picks
    the victims). Swapped and waiting requests are admitted only in steps without a
    preemption, and waiting ones only when no request is left swapped out, so preempted work
    is never starved by new arrivals.
    When `allocate` fails the preemption policy picks a victim among the running requests.
    """

    def __init__(self, config: SchedulerConfig, manager: KVCacheManager) -> None:
        self.config = config
        self.manager = manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self._pick_victim = registry.get("victim", manager.policy.victim).factory
        order = make_order(config.scheduling_policy)
        # None for fcfs: the queues stay as they are, and the hot paths check one attribute
        self._order = order if order.reorders else None
        if order.chooses_victim:
            self._pick_victim = lambda running, pages_held: order.victim(running)
        self.step_id = 0
        self.num_preemptions = 0
        self.num_swaps_out = 0
        self.num_swaps_in = 0
        self.itls_s = array("d")  # every gap between two consecutive tokens of a request

    def add_request(self, request: Request) -> None:
        """Queue a request (callers add them in arrival order)."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        """True while any request is waiting, running or swapped out."""
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self, now_s: float = 0.0) -> SchedulerOutput:
        """Decide the next step at clock time `now_s`."""
        step = StepBatch(self.config.max_num_batched_tokens)
        manager = self.manager
        manager.begin_step()
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_swapped(step, now_s)
            if not self.swapped:
                self._schedule_waiting(step, now_s)
        manager.end_step(step.ops)
        self.step_id += 1
        return step.output(self.step_id - 1)

    def update(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Sequence[int | None] | None = None,
        now_s: float = 0.0,
        stopped: set[int] | frozenset[int] = frozenset(),
    ) -> list[Request]:
        """Commit a finished step: advance tokens, stamp times, finish and free requests.

        `sampled_token_ids` is aligned with `output.scheduled` (None where nothing was sampled,
        or None altogether in the simulator); `stopped` holds request ids the engine stopped at
        eos or a stop token. Returns the requests that finished in this step.
        """
        # Per scheduled request, every step: keep the loop to the attribute updates it must do.
        # Samples pair with the batch by position (all None in the simulator), and the
        # gaps between tokens go into the array in one call per step.
        finished: list[Request] = []
        gaps: list[float] = []
        add_gap = gaps.append
        running_status = RequestStatus.RUNNING
        samples = sampled_token_ids
        if samples is None:
            samples = [None] * len(output.requests)
        for request, num_new, num_done, token in zip(
            output.requests, output.num_new_tokens, output.num_computed_tokens, samples, strict=True
        ):
            if request.status is not running_status:
                continue
            computed = num_done + num_new
            request.num_computed_tokens = computed
            num_output = request.num_output_tokens
            if computed != request.prompt_len + num_output:
                continue  # a prefill chunk that does not reach the end yet
            if token is not None:
                request.output_token_ids.append(token)
            num_output += 1
            request.num_output_tokens = num_output
            last = request.last_token_s
            if last is None:  # set only here, together with first_token_s
                request.first_token_s = now_s
            else:
                add_gap(now_s - last)
            request.last_token_s = now_s
            if num_output >= request.max_output_tokens:
                request.status = RequestStatus.FINISHED_LENGTH
            elif stopped and request.request_id in stopped:
                request.status = RequestStatus.FINISHED_STOPPED
            else:
                continue
            request.finish_s = now_s
            finished.append(request)
        self.itls_s.fromlist(gaps)  # a list in C (extend iterates)
        if finished:
            for request in finished:
                self.manager.free(request)
            self.running = _without(self.running, finished)
        return finished

    def plan_decode_run(self, max_steps: int) -> DecodeAhead | None:
        """The steps (at most `max_steps`) the running batch would take as nothing but its own
        decodes, one token each: no request waiting or swapped out, the batch within the
        token budget, none finishing before the last of these steps (some may finish in it),
        memory from the free list (`KVCacheManager.decode_run_ahead`); arrivals are the
        caller's to check. Such a run is committed at once by `advance_decode_run` (the
        simulator's fast path). None where fewer than two such steps could run: one step
        gains nothing over stepping."""
        running = self.running
        if (self.waiting or self.swapped or not running
                or len(running) > self.config.max_num_batched_tokens):
            return None
        ahead = self.manager.decode_run_ahead(running, max_steps)
        return ahead if ahead is not None and ahead.num_steps >= 2 else None

    def advance_decode_run(self, ends_s: Sequence[float], ahead: DecodeAhead) -> DecodeRun:
        """Schedule and commit `len(ends_s)` steps of one decode token per running request,
        step j ending at `ends_s[j]`: the same pages, token counts, stamps and inter-token gaps
        as `schedule` and `update` step by step, and the requests that reach their output
        length in the last step finished and freed (`plan_decode_run` must have planned
        `ahead`, for at least as many steps, with nothing changed since)."""
        running, num_steps = self.running, len(ends_s)
        assert len(ahead.states) == len(running), "the batch changed since the run was planned"
        pages_taken = self.manager.advance_decodes(ahead, num_steps)
        num_seqs = len(running)
        first_end, last = ends_s[0], ends_s[-1]
        gaps: list[float] = []
        finished = []
        for request in running:  # one pass: the first step's gaps, the stamps, the counts
            # every request has a token out (decode_run_ahead): last_token_s is set
            gaps.append(first_end - request.last_token_s)  # type: ignore[operator]
            request.num_computed_tokens += num_steps
            request.num_output_tokens += num_steps
            request.last_token_s = last
            if request.num_output_tokens >= request.max_output_tokens:
                request.status = RequestStatus.FINISHED_LENGTH
                request.finish_s = last
                finished.append(request)
        itls = self.itls_s
        itls.fromlist(gaps)
        for previous, end in itertools.pairwise(ends_s):
            itls.extend(array("d", (end - previous,)) * num_seqs)
        if finished:  # as `update`: freed in batch order, then gone from the running list
            for request in finished:
                self.manager.free(request)
            self.running = _without(running, finished)
        run = DecodeRun(self.step_id, num_seqs, ahead.sum_computed, ahead.max_computed,
                        pages_taken, finished)
        self.step_id += num_steps
        return run

    def abort(self, request: Request, now_s: float = 0.0) -> None:
        """Stop a request wherever it is and free its memory."""
        for queue in (self.waiting, self.swapped):
            if request in queue:
                queue.remove(request)
        if request in self.running:
            self.running.remove(request)
        self.manager.free(request)
        request.status = RequestStatus.FINISHED_ABORTED
        request.finish_s = now_s

    # ----------------------------------------------------------------------------- internals

    def _schedule_running(self, step: StepBatch) -> None:
        # The per-token hot path of every simulation. Runs of plain decodes go to the manager in
        # one call (`allocate_decodes`: the same decisions as `allocate` one by one) and join the
        # batch with list operations; whatever stops a run (a prefill chunk, a new block, a full
        # memory and so preemption) takes the general path below, one request at a time.
        running, manager = self.running, self.manager
        allocate, allocate_decodes = manager.allocate, manager.allocate_decodes
        requests, new, computed = step.requests, step.new, step.computed
        index = 0
        while index < len(running) and step.budget > 0:
            num_decodes = allocate_decodes(running, index, step.budget)
            if num_decodes:
                decodes = running[index : index + num_decodes]
                dones = [request.num_computed_tokens for request in decodes]
                requests += decodes
                new += [1] * num_decodes
                computed += dones
                step.budget -= num_decodes
                step.num_context += sum(dones) + num_decodes
                step.num_decode += num_decodes
                longest = max(dones) + 1
                if longest > step.longest_decode:
                    step.longest_decode = longest
                index += num_decodes
                if index == len(running) or not step.budget:
                    break
            request = running[index]
            num_new = request.prompt_len + request.num_output_tokens - request.num_computed_tokens
            if num_new > step.budget:
                num_new = step.budget
            if num_new <= 0:
                index += 1
                continue
            ops = allocate(request, num_new)
            while ops is None:
                victim = self._pick_victim(running, manager.num_pages_held)
                if running.index(victim) < index:
                    index -= 1
                self._preempt(victim, step)
                if victim is request:
                    break
                ops = allocate(request, num_new)
            if ops is None:
                continue  # the request itself was preempted; `index` now points past it
            step.add(request, num_new, ops)
            index += 1

    def _preempt(self, victim: Request, step: StepBatch) -> None:
        manager = self.manager
        self.running.remove(victim)
        step.unschedule(victim)
        if manager.should_swap(victim) and manager.can_swap_out(victim):
            step.ops.extend(manager.swap_out(victim))
            victim.status = RequestStatus.SWAPPED
            victim.num_swaps_out += 1
            self.num_swaps_out += 1
            self.swapped.append(victim)
        else:
            manager.free(victim)
            victim.num_computed_tokens = victim.kv_transfer_tokens = 0  # all recomputed here
            victim.status = RequestStatus.WAITING
            self.waiting.appendleft(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        step.preempted.append(victim)

    def _schedule_swapped(self, step: StepBatch, now_s: float) -> None:
        manager, running = self.manager, self.running
        order = self._order
        if order is not None and order.arranges_swapped and len(self.swapped) > 1:
            order.arrange(self.swapped, manager, now_s)
        while self.swapped and step.budget > 0 and len(running) < self.config.max_num_seqs:
            request = self.swapped[0]
            if not manager.can_swap_in(request):
                break
            ops = manager.swap_in(request)
            assert ops is not None
            self.swapped.popleft()
            step.ops.extend(ops)
            request.status = RequestStatus.RUNNING
            self.num_swaps_in += 1
            running.append(request)
            num_new = min(request.num_tokens - request.num_computed_tokens, step.budget)
            grow = manager.allocate(request, num_new)
            if grow is not None:  # else it runs from the next step, preempting if it must
                step.add(request, num_new, grow)

    def _schedule_waiting(self, step: StepBatch, now_s: float) -> None:
        config, manager, running = self.config, self.manager, self.running
        order = self._order
        if (order is not None and len(self.waiting) > 1 and step.budget > 0
                and len(running) < config.max_num_seqs):
            order.arrange(self.waiting, manager, now_s)
        while self.waiting and step.budget > 0 and len(running) < config.max_num_seqs:
            request = self.waiting[0]
            error = self._admission_error(request)
            if error is not None:
                self.waiting.popleft()
                request.status = RequestStatus.FINISHED_ERROR
                request.error = error
                request.finish_s = now_s
                step.failed.append(request)
                continue
            hit = manager.num_computed_prefix_tokens(request)
            if request.kv_transfer_tokens > hit:  # the rest of its KV comes from elsewhere
                hit = request.kv_transfer_tokens
            num_new = request.num_tokens - hit
            if num_new > step.budget:
                if not config.enable_chunked_prefill:
                    break
                num_new = step.budget
            request.num_computed_tokens = hit
            ops = self._admit(request, hit, num_new)
            if ops is None and hit and not running:
                # Alone, a request always fits once every cached page is evictable; its own
                # prefix hits pin pages and can fragment contiguous memory, so drop them.
                request.num_computed_tokens = hit = request.kv_transfer_tokens = 0
                num_new = min(request.num_tokens, step.budget)
                ops = self._admit(request, hit, num_new)
            if ops is None:
                request.num_computed_tokens = 0
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
                request.num_cached_tokens = hit
                if manager.tiers is not None:
                    manager.count_first_hits()
            running.append(request)
            step.add(request, num_new, ops)

    def _admit(self, request: Request, hit: int, num_new: int) -> MemOps | None:
        """Allocate a waiting request's first `num_new` tokens after its `hit`; with
        `reserve_full_isl`, only if the rest of its known sequence would fit now as well (the
        check of vLLM's allocate_slots: hit pages that are cached-free count as taken)."""
        rest = request.num_tokens - hit
        if (self.config.reserve_full_isl and num_new < rest
                and not self.manager.can_allocate(request, rest)):
            return None
        return self.manager.allocate(request, num_new)

    def _admission_error(self, request: Request) -> str | None:
        max_len = self.config.max_model_len
        if request.total_len > max_len:
            return (
                f"request {request.request_id} needs {request.total_len} tokens "
                f"({request.prompt_len} prompt + {request.max_output_tokens} output), more than "
                f"max_model_len {max_len}"
            )
        pages = self.manager.pages_needed_alone(request)
        if pages > self.manager.num_total_pages:
            return (
                f"request {request.request_id} needs {pages} KV pages but the cache has only "
                f"{self.manager.num_total_pages} ({self.manager.explain_pages_needed(request)})"
            )
        return None


def _without(requests: list[Request], gone: list[Request]) -> list[Request]:
    """A new list of `requests` less `gone` (a few of them), in order: a copy and a C scan
    per request gone, cheaper than a comprehension over the batch."""
    remaining = requests.copy()
    for request in gone:
        remaining.remove(request)  # by identity (Request has no __eq__)
    return remaining
