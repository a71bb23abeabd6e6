"""Stage 1's evidence: engine steps reconstructed from a bench run's streamed timestamps
(chunks that arrive together are one step; `group_steps`), each with the work it must have
done under the token budget (`reconstruct_profile`), and the regular ones of several runs,
pooled (`regular_steps`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvlab.errors import KvlabError
from kvlab.fidelity.calibration import MEMORY_COLUMNS, STEP_FEATURES, TIME_COLUMN
from kvlab.policies.serving import ServingConfig

if TYPE_CHECKING:
    from kvlab.bench import BenchResult

from kvlab.fidelity.bench_server import server_step_count
from kvlab.fidelity.bench_tuning import (
    GAP_FRACTIONS,
    LATE_MEMBER_FRACTION,
    READ_TOGETHER_FRACTION,
)


def reconstruct_profile(result: BenchResult, max_num_batched_tokens: int,
                        enable_chunked_prefill: bool = True,
                        intake_s: float = 0.0) -> pd.DataFrame:
    """Stage 1's step profile: one row per reconstructed step, with the columns
    `fit_cost_model` reads (memory work none) and `regular` (False where a running request
    missed the step: preempted, or its chunk arrived late; or where the engine may have been
    idle before it; such rows are left out of the fit).

    `intake_s`: how long a request may take from its send to the server's engine. A step
    begins at the end of the one before only where the engine was busy then: a request was
    streaming its tokens, or had been sent more than `intake_s` before and was still to
    have its first token; a request sent later may still have been on its way in, the
    engine idle until it came, and the step as timed holds that wait (`fit_bench` measures
    the way in and reconstructs again)."""
    groups = group_steps(result.requests, server_step_count(result))
    rows = _Attribution(result.requests, max_num_batched_tokens, enable_chunked_prefill,
                        intake_s)
    return pd.DataFrame([rows.step(index, group) for index, group in enumerate(groups)])


def regular_steps(runs: Sequence[BenchResult], serving: ServingConfig, shares: list[float],
                  intake_s: float = 0.0, source: str = "bench"
                  ) -> tuple[list[pd.DataFrame], pd.DataFrame]:
    """Each run's reconstructed steps (`reconstruct_profile`) and the regular ones of all,
    pooled, each with its run's steal share: every run's first step is left out (it pays a
    cold start), as are the steps a running request missed or the engine may have been
    idle before."""
    profiles = [reconstruct_profile(run, serving.max_num_batched_tokens,
                                    serving.enable_chunked_prefill, intake_s) for run in runs]
    regular = pd.concat([p[p["regular"]].iloc[1:].assign(steal_share=share)
                         for p, share in zip(profiles, shares, strict=True) if len(p)])
    if len(regular) < 4:
        raise KvlabError(f"{source}: only {len(regular)} steps could be reconstructed from "
                         "the streamed timestamps (was the run streamed, with several tokens "
                         "per request?)")
    return profiles, regular


def group_steps(requests: Sequence[Any], num_server_steps: int | None = None,
                fractions: Sequence[float] = GAP_FRACTIONS, *, causal: bool = False
                ) -> list[list[tuple[float, int]]]:
    """The chunk arrivals (time, request index) grouped into steps: a new step begins after
    a gap longer than a threshold, or when a request would appear twice (a step gives each
    request one chunk), or with `causal` at a request's first chunk when the step would
    have begun (the client saw the step before it end) before the request was sent; a chunk
    read late, after the next step's had begun, still joins its own step (`_group`). The
    threshold is the one of `fractions` (times the median inter-chunk gap) whose step count
    comes closest to the server's own count when it exports one (a server streams one step's
    chunks over a spread that depends on its load), else a third of the median gap."""
    events = sorted((t, i) for i, r in enumerate(requests) for t in r.chunk_times_s)
    gaps = [g for r in requests for g in r.itls_s()]
    median = float(np.median(gaps)) if gaps else 0.0
    sent = ({(r.chunk_times_s[0], i): r.arrival_s for i, r in enumerate(requests)
             if r.chunk_times_s} if causal else None)
    together_s = READ_TOGETHER_FRACTION * median
    late = _LateChunks(LATE_MEMBER_FRACTION * median, together_s, {
        (r.chunk_times_s[0], i) for i, r in enumerate(requests) if len(r.chunk_times_s) > 1
        and r.chunk_times_s[1] - r.chunk_times_s[0] <= together_s} if causal else set())
    if not num_server_steps:
        return _group(events, max(2e-4, median / 3.0), sent, late)
    candidates = [_group(events, max(2e-5, fraction * median), sent, late)
                  for fraction in fractions]
    return min(candidates, key=lambda groups: abs(len(groups) - num_server_steps))


@dataclass(slots=True, frozen=True)
class _LateChunks:
    """What may join the step before the last (`_group`): chunks up to `window_s` after its
    start; chunks up to `together_s` apart came in one read (or one burst of reads), and
    `first_read_with_second` are the first chunks that came with their request's second."""

    window_s: float = 0.0
    together_s: float = 0.0
    first_read_with_second: set[tuple[float, int]] = field(default_factory=set)


def _group(events: list[tuple[float, int]], threshold: float,
           sent: dict[tuple[float, int], float] | None,
           late: _LateChunks) -> list[list[tuple[float, int]]]:
    """Greedy grouping (`group_steps`). A chunk that arrives within `late.window_s` of the
    start of the second to last group joins that one, a late member of its step read after a
    chunk of the next step had opened a new group, where its request is in neither of the
    last two groups and the chunk is not its first; or, with `sent` (causal grouping), where
    it is its first, from a step begun after the request was sent, read together with its
    second (its token came a step before the read) or with the late members of that step.
    (A client reading 300 streams reads one step's chunks over 10-20 ms, some after the next
    step's, and after a pause of its own, each stream's backlog at once.)
    """
    groups: list[list[tuple[float, int]]] = []
    last_group: dict[int, int] = {}  # request -> the group of its latest chunk
    last = began = -math.inf  # began: when the client saw the step before this group end
    for time_s, index in events:
        current = len(groups) - 1
        if (current >= 1 and time_s - last <= threshold
                and time_s - groups[-2][0][0] <= late.window_s
                and _late_member(time_s, index, last_group.get(index), groups, late, sent)):
            groups[-2].append((time_s, index))
            last_group[index], last = current - 1, time_s
            continue
        # (a request is in the last group exactly when its latest chunk is)
        joins = bool(groups) and time_s - last <= threshold and last_group.get(index) != current
        if joins and sent is not None and sent.get((time_s, index), -math.inf) > began:
            joins = False  # its first token: from a step that began before it was sent
        if not joins:
            began = groups[-1][0][0] if groups else math.inf  # (none seen end: any)
            groups.append([])
        groups[-1].append((time_s, index))
        last_group[index], last = len(groups) - 1, time_s
    for group in groups:  # a late member joined after later chunks
        group.sort()
    return groups


def _late_member(time_s: float, index: int, previous: int | None,
                 groups: list[list[tuple[float, int]]], late: _LateChunks,
                 sent: dict[tuple[float, int], float] | None) -> bool:
    """Whether the chunk may join the second to last group (`_group`'s rules)."""
    if previous is not None:
        return previous <= len(groups) - 3
    if sent is None:  # a first chunk moves back only where it is known when it was sent
        return False
    before, latest = groups[-2], groups[-1]
    with_late_members = (before[-1][0] > latest[0][0]  # it took chunks after the last began
                         and time_s - before[-1][0] <= late.together_s)
    if not with_late_members and (time_s, index) not in late.first_read_with_second:
        return False
    began = groups[-3][0][0] if len(groups) >= 3 else math.inf  # (none seen end: any)
    return sent.get((time_s, index), -math.inf) <= began


class _Attribution:
    """Walks the steps in order, keeping each request's prefill progress and tokens."""

    def __init__(self, requests: Sequence[Any], budget: int, chunked: bool,
                 intake_s: float = 0.0) -> None:
        self.requests, self.budget, self.chunked = requests, budget, chunked
        self.intake_s = intake_s
        self.progress = [0] * len(requests)  # prompt tokens prefilled
        self.emitted = [0] * len(requests)  # output tokens received
        self.next_chunk = [0] * len(requests)
        self.last_end = -math.inf
        self.by_arrival = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)

    def step(self, index: int, group: list[tuple[float, int]]) -> dict[str, Any]:
        end = group[0][0]
        present = {i for _, i in group}
        busy = self._in_flight(self.last_end)
        start = self.last_end if busy else min(self.requests[i].arrival_s for i in present)
        row = dict.fromkeys(STEP_FEATURES, 0)
        row.update(dict.fromkeys(MEMORY_COLUMNS, 0))
        longest = 0
        decodes = [i for i in present if self.emitted[i] > 0]
        for i in decodes:
            context = self.requests[i].prompt_len + self.emitted[i]
            row["num_context_tokens"] += context
            longest = max(longest, context)
        row["num_decode_tokens"] = len(decodes)
        budget = self.budget - len(decodes)
        firsts = [i for i in self.by_arrival if i in present and self.emitted[i] == 0]
        for i in firsts:  # their prompts end in this step
            budget -= self._prefill(i, self.requests[i].prompt_len - self.progress[i], row)
        if self.chunked:
            for i in self._waiting(start, present):
                if budget <= 0:
                    break
                # A prompt whose rest fits the budget would have ended here, its first token
                # with this step's: it was not at the server yet (sent, but its API had not
                # handed it on) or had to wait, so it computed nothing. A longer one takes
                # the budget left.
                if self.requests[i].prompt_len - self.progress[i] <= budget:
                    continue
                budget -= self._prefill(i, budget, row)
        row["num_seqs"] = len(present) + sum(1 for i in self._waiting(start, present)
                                             if self.progress[i] > 0)
        row["num_padded_context_tokens"] = len(decodes) * longest
        missing = any(self.emitted[i] > 0 and i not in present
                      and self.next_chunk[i] < len(self.requests[i].chunk_times_s)
                      for i in range(len(self.requests)))
        for i in present:
            self.emitted[i] += self.requests[i].chunk_tokens[self.next_chunk[i]]
            self.next_chunk[i] += 1
        self.last_end = end
        return {**row, "step_id": index, "start_s": start, TIME_COLUMN: max(end - start, 0.0),
                "regular": not missing and busy}

    def _prefill(self, i: int, tokens: int, row: dict[str, Any]) -> int:
        if tokens <= 0:
            return 0
        done = self.progress[i]
        row["num_prefill_tokens"] += tokens
        row["num_context_tokens"] += done + tokens
        row["num_attention_pairs"] += tokens * done + tokens * (tokens + 1) // 2
        self.progress[i] += tokens
        return tokens

    def _waiting(self, start: float, present: set[int]) -> list[int]:
        """Requests at the server when the step began, prompt not yet done, FCFS."""
        return [i for i in self.by_arrival
                if self.requests[i].arrival_s <= start and i not in present
                and self.emitted[i] == 0 and self.requests[i].chunk_times_s
                and self.progress[i] < self.requests[i].prompt_len]

    def _in_flight(self, time_s: float) -> bool:
        """Some request was at the engine at `time_s` with chunks to come: streaming them,
        or sent more than `intake_s` before."""
        sent_by = time_s - self.intake_s
        return any(r.chunk_times_s and r.chunk_times_s[-1] > time_s
                   and (r.arrival_s <= sent_by or r.chunk_times_s[0] <= time_s)
                   for r in self.requests)
