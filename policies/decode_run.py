"""A decode run: steps of one decode token per running request, committed at once (the
scheduler's `advance_decode_run`), and the context columns of such steps."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.policies.request import Request


@dataclass(slots=True)  # not frozen: a frozen init sets each field through object.__setattr__
class DecodeRun:
    """Steps of one decode token per running request, committed at once: the first step's id,
    the batch size, the sum and the largest of the requests' computed tokens before the first
    step, the pages taken by the end of each step (cumulated) and the requests that finished in
    the last step."""

    first_step_id: int
    num_seqs: int
    sum_computed: int
    max_computed: int
    pages_taken: list[int]
    finished: list[Request]

    def context_columns(self, num_steps: int) -> tuple[range, range]:
        """The context tokens and the padded context tokens of each of the run's first
        `num_steps` steps."""
        return decode_contexts(self.num_seqs, self.sum_computed, self.max_computed, num_steps)


def decode_contexts(num_seqs: int, sum_computed: int, max_computed: int, num_steps: int
                    ) -> tuple[range, range]:
    """The context tokens and the padded context tokens of each of `num_steps` steps of a
    batch of `num_seqs` decodes whose computed tokens summed to `sum_computed`, the most
    `max_computed`, before the first: as `schedule` counts them for a batch of decodes (each
    step adds one token to every context)."""
    context, padded = sum_computed + num_seqs, num_seqs * (max_computed + 1)
    end = num_seqs * num_steps
    return range(context, context + end, num_seqs), range(padded, padded + end, num_seqs)
