"""The scheduler's step being built: its batch, the token budget left, memory work,
preemptions and the counters a step's cost needs (torch-free)."""

from __future__ import annotations

from kvlab.policies.manager import NO_OPS
from kvlab.policies.outputs import MemOps, SchedulerOutput
from kvlab.policies.request import Request


class StepBatch:
    """The step being built: the batch, token budget left, memory work, preemptions, counters."""

    __slots__ = (
        "budget",
        "computed",
        "failed",
        "longest_decode",
        "new",
        "num_context",
        "num_decode",
        "num_pairs",
        "num_prefill",
        "ops",
        "preempted",
        "requests",
    )

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.requests: list[Request] = []
        self.new: list[int] = []
        self.computed: list[int] = []
        self.ops = MemOps()
        self.preempted: list[Request] = []
        self.failed: list[Request] = []
        self.num_prefill = self.num_decode = self.num_context = self.num_pairs = 0
        self.longest_decode = 0  # context of the longest decode in the batch, this token included

    def add(self, request: Request, num_new: int, ops: MemOps) -> None:
        done = request.num_computed_tokens
        self.requests.append(request)
        self.new.append(num_new)
        self.computed.append(done)
        self.budget -= num_new
        self._count(request, num_new, done, 1)
        if ops is not NO_OPS and ops:
            self.ops.extend(ops)

    def unschedule(self, request: Request) -> None:
        for index, scheduled in enumerate(self.requests):
            if scheduled is request:
                num_new, done = self.new[index], self.computed[index]
                self.budget += num_new
                self._count(request, num_new, done, -1)
                del self.requests[index], self.new[index], self.computed[index]
                if done + 1 == self.longest_decode:
                    self.longest_decode = max(
                        (
                            c + 1
                            for r, n, c in zip(self.requests, self.new, self.computed, strict=True)
                            if is_decode(r, n, c)
                        ),
                        default=0,
                    )
                return

    def _count(self, request: Request, new: int, done: int, sign: int) -> None:
        self.num_context += sign * (done + new)
        if is_decode(request, new, done):
            self.num_decode += sign
            if sign > 0 and done + 1 > self.longest_decode:
                self.longest_decode = done + 1
        else:
            self.num_prefill += sign * new
            self.num_pairs += sign * (new * done + new * (new + 1) // 2)

    def output(self, step_id: int) -> SchedulerOutput:
        # Positional, in SchedulerOutput's field order (keywords cost twice the call).
        return SchedulerOutput(
            step_id,
            self.ops,
            self.requests,
            self.new,  # num_new_tokens
            self.computed,  # num_computed_tokens
            self.preempted,
            self.failed,
            self.num_prefill,
            self.num_decode,
            self.num_context,
            self.num_pairs,  # num_attention_pairs
            self.num_decode * self.longest_decode,  # num_padded_context_tokens
        )


def is_decode(request: Request, num_new: int, done: int) -> bool:
    """Whether scheduling `num_new` tokens after `done` computed ones is a decode: the one token
    left, after at least one computed."""
    return num_new == 1 and 0 < done == request.prompt_len + request.num_output_tokens - 1
