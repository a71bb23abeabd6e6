"""The decode fast path: a batch's plain decode steps claimed without the planner.

A step of a large batch is hundreds of decodes, nearly all of them a counter update; claiming a
run of them in one call (and whole runs of steps ahead, for the simulator) saves a Python call
and the lookups per token, which is most of the cost of a simulation. Every function here gives
exactly what `KVCacheManager.allocate(request, 1)` one request and one step at a time would.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from kvlab.policies.groups.full import FullAttentionManager
from kvlab.policies.groups.table import SeqState
from kvlab.policies.request import Request


@dataclass(slots=True)
class DecodeAhead:
    """A run of plain decode steps the batch can take on the fast path
    (`KVCacheManager.decode_run_ahead`): how many steps, the sequences' states in batch order,
    and the sum and the largest of their computed tokens before the first step; once
    advanced, the pages a precision policy's ballast gave back to the free list by each
    step, cumulated (None: none)."""

    num_steps: int
    states: list[SeqState]
    sum_computed: int
    max_computed: int
    pages_released: list[int] | None = None


def allocate_decodes(group: FullAttentionManager, requests: list[Request], start: int,
                     budget: int) -> int:
    """`KVCacheManager.allocate_decodes` on one full-attention group."""
    seqs = group.seqs
    grow = group.grow_by_one_page if group.free_list is not None else None
    batch = requests[start : start + budget] if start or budget < len(requests) else requests
    num_claimed = adjust = 0  # live slots gained: one per claim, plus adjust
    for request in batch:
        done = request.num_computed_tokens
        if request.prompt_len + request.num_output_tokens - done != 1 or not done:
            break
        try:
            state = seqs[request.request_id]
        except KeyError:
            break
        if state.num_tokens == done < state.fast_limit:  # the slot is held: a counter update
            state.num_tokens = done + 1
        elif done < state.fast_limit:  # the token was claimed before (or more than it)
            claimed = max(done + 1, state.num_tokens)
            adjust += claimed - state.num_tokens - 1
            state.num_tokens = claimed
        elif grow is not None and grow(state, done + 1):
            adjust -= 1  # grow counted its token
        else:
            break
        num_claimed += 1
    group.num_live_slots += num_claimed + adjust
    return num_claimed


def decode_run_ahead(group: FullAttentionManager, requests: list[Request],
                     max_steps: int) -> DecodeAhead | None:
    """`KVCacheManager.decode_run_ahead` on one full-attention group."""
    if group.free_list is None or max_steps <= 0:
        return None
    page_size, state_of = group.page_size, group.seqs.get
    steps, nearest = max_steps, max_steps  # nearest: the fewest steps to a page's end
    states: list[SeqState] = []
    add_state = states.append
    sum_computed = max_computed = 0
    for request in reversed(requests):  # the newest first: the likeliest not to decode
        done = request.num_computed_tokens
        num_output = request.num_output_tokens
        state = state_of(request.request_id)
        # (no output yet: the last token of a prompt, a prefill that stamps a first token)
        if (request.prompt_len + num_output - done != 1 or not num_output
                or state is None or state.hash_outputs or state.num_tokens != done):
            return None
        held = len(state.pages) * page_size
        if state.fast_limit != held:  # a page to register or a shared tail ahead
            return None
        if held - done < nearest:
            nearest = held - done
        if request.max_output_tokens - num_output < steps:
            steps = request.max_output_tokens - num_output
        sum_computed += done
        if done > max_computed:
            max_computed = done
        add_state(state)
    states.reverse()  # batch order, as `advance_decodes` takes the pages
    return DecodeAhead(_steps_with_free_pages(group, states, steps, nearest), states,
                       sum_computed, max_computed)


def _steps_with_free_pages(group: FullAttentionManager, states: list[SeqState], steps: int,
                           nearest: int) -> int:
    """The first of `steps` decode steps of the sequences of `states` (plain decodes, each at
    least `nearest` steps from its pages' end) whose page the free list lacks; `steps` when it
    has them all."""
    page_size, free = group.page_size, group.free_list
    assert free is not None
    # Each sequence takes at most ceil(steps / page_size) pages in `steps` steps: count them
    # one by one only where the free list might run short.
    if nearest >= steps or len(states) * -(-steps // page_size) <= len(free):
        return steps
    crossings: list[int] = []  # for every page to take: the step that takes it
    for state in states:  # (a plain decode: num_tokens is its computed tokens)
        crossings += range(len(state.pages) * page_size - state.num_tokens, steps, page_size)
    if len(crossings) <= len(free):
        return steps
    crossings.sort()
    return crossings[len(free)]


def advance_decodes(group: FullAttentionManager, ahead: DecodeAhead,
                    num_steps: int) -> list[int]:
    """`KVCacheManager.advance_decodes` on one full-attention group."""
    assert num_steps <= ahead.num_steps, "more steps than decode_run_ahead allowed"
    page_size, free = group.page_size, group.free_list
    assert free is not None
    crossings: list[tuple[int, int, SeqState]] = []  # (step, batch position, state) per page
    for index, state in enumerate(ahead.states):
        # (decode_run_ahead: num_tokens is the computed tokens, fast_limit the pages' end)
        # the step that fills its last page
        first = state.fast_limit - state.num_tokens
        if first < num_steps:
            crossings.append((first, index, state))
            if first + page_size < num_steps:  # (the usual run crosses one page end)
                crossings += [(step, index, state)
                              for step in range(first + page_size, num_steps, page_size)]
        state.num_tokens += num_steps
    crossings.sort()  # step by step, in batch order, as one by one (no two tie)
    taken = [0] * num_steps
    for step, _, state in crossings:
        state.pages.append(free.popleft())
        state.num_blocks += 1
        taken[step] += 1
    for _, _, state in crossings:  # the others' limit is still the end of their pages
        state.fast_limit = len(state.pages) * page_size
    group.num_live_slots += len(ahead.states) * num_steps
    return list(itertools.accumulate(taken))
