"""kvlab's side of the KV lockstep: the bench's requests replayed through kvlab's manager on the
server's configuration and timeline, its prefix-cache changes recorded step by step.

The replay runs the server's configuration (block size, blocks, the `vllm` scheduling preset)
on the server's timeline: each step ends when the client saw the server's next step end (the
streamed chunks that arrived together, or the server's own event batches where it publishes one
every step), and each request arrives when the server admitted it, so that requests join the
same steps they joined on the server. kvlab's changes carry their KV-cache group
(`kvlab.policies.kv_events`).
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.errors import KvlabError
from kvlab.fidelity.from_bench import (
    GAP_FRACTIONS,
    group_steps,
    served_request,
    server_step_count,
)
from kvlab.fidelity.kv_changes import Change
from kvlab.policies.kv_events import STORED, KVEventLog
from kvlab.policies.request import hash_page
from kvlab.sim.simulator import Simulation
from kvlab.traces import Trace, TraceRequest

if TYPE_CHECKING:
    from kvlab.bench import BenchRequest, BenchResult
    from kvlab.sim import SimConfig

# Thresholds (times the median inter-chunk gap) tried for grouping chunks into steps: wider
# than calibration's, since a step split in two puts the replay's decodes a step ahead (on
# vLLM CPU, 2x the median still keeps distinct steps apart: the split at a repeated request
# bounds a group).
STEP_GAP_FRACTIONS = (*GAP_FRACTIONS, 1.0, 1.2, 1.5, 2.0)
# Requests sent closer together than this may reach the server's scheduler in either order
# (its API's latency moves by a few milliseconds with load: 2.5-7 ms on vLLM CPU, see
# docs/validation.md); one sent earlier than that is queued first.
SEND_ORDER_SLACK_S = 0.01


def replay_trace(result: BenchResult, step_ends: list[float], budget: int, page_size: int,
                 stored_at: dict[int | None, list[float]], exact_steps: bool = False) -> Trace:
    """The requests the server ran, as it ran them: each arriving just as the server step that
    admitted it began, with its prompt's token ids and the output ids it streamed (so output
    blocks hash as the server's). Requests the server refused (no token came back) are left
    out.

    The admitting step is the earlier of the step whose chunks include the request's first
    token and the first step since it was sent whose events stored a block of its prompt
    (`stored_at`: key -> when the client received each batch storing it, in order; a prompt
    whose prefill was split over steps stores its first blocks before its first token). A
    prompt longer than the step's token `budget` with neither arrives when the client sent
    it. With `exact_steps` (the server's own step ends) a request arrives at its step's start
    even where the client sent it a little later: the server took it in between two steps,
    after the one before had ended.

    No request arrives before one sent more than `SEND_ORDER_SLACK_S` earlier: the server
    queues requests in the order they came (first come, first served), so one moved to its
    admitting step's start holds back those sent well after it. (Otherwise they could jump
    the queue in the replay, where a block they share with it, stored by it, looks like their
    own admission.) Requests sent closer together keep the order their evidence gives: the
    server's API may have handed them on in either order."""
    prompts = result.prompt_token_ids
    if prompts is None:
        raise KvlabError("the bench result holds no prompt token ids: run `kvlab bench serve` "
                         "with --kv-events", parameters=("kv_events",))
    answered = [(record, prompt) for record, prompt in zip(result.requests, prompts, strict=True)
                if record.chunk_times_s and record.output_token_ids and prompt]
    answered.sort(key=lambda pair: (pair[0].arrival_s, pair[0].request_id))  # as sent
    requests: list[TraceRequest] = []
    latest, num_before = 0.0, 0  # the latest arrival of the requests sent well before
    for record, prompt in answered:
        while record.arrival_s - answered[num_before][0].arrival_s > SEND_ORDER_SLACK_S:
            latest = max(latest, requests[num_before].arrival_s)
            num_before += 1
        step, first_token_step = _admitting_step(record, prompt, step_ends, page_size, stored_at)
        arrival = record.arrival_s
        if step is not None and (len(prompt) <= budget or step < first_token_step):
            arrival = step_ends[step - 1] if step > 0 else 0.0
            if not exact_steps:  # a step's start as the client saw it: never before the send
                arrival = max(arrival, record.arrival_s)
        requests.append(served_request(record, prompt, max(arrival, latest)))
    if not requests:
        raise KvlabError("no request of the bench result streamed token ids back: the server "
                         "must return them (vLLM and kvlab serve do with return_token_ids)")
    requests.sort(key=lambda r: r.arrival_s)  # stable: as sent where they tie
    return Trace(name="bench replay", dataset_name="bench", source="bench", requests=requests)


def _admitting_step(record: Any, prompt: list[int], step_ends: list[float], page_size: int,
                    stored_at: dict[int | None, list[float]]) -> tuple[int | None, int]:
    """(the step that admitted the request, None where neither says; the step whose chunks
    include its first token: the last to end at or before it)."""
    first_token_step = bisect.bisect_right(step_ends, record.chunk_times_s[0]) - 1
    step, key, stored = first_token_step, 0, []
    for start in range(0, len(prompt) - page_size + 1, page_size):
        key = hash_page(key, prompt[start:start + page_size])
        times = stored_at.get(key, ())
        at = bisect.bisect_left(times, record.arrival_s)  # stored since it was sent
        if at < len(times):
            stored.append(times[at])
    if stored:
        first_stored = min(stored)
        at = bisect.bisect_left(step_ends, first_stored)
        near = min((i for i in (at - 1, at) if 0 <= i < len(step_ends)),
                   key=lambda i: abs(step_ends[i] - first_stored))
        step = min(step, near)
    return (step if step >= 0 else None), first_token_step


def server_step_ends(result: BenchResult) -> list[float]:
    """When each of the server's steps ended, on the run's clock, strictly increasing: from
    its event batches where it published one every step (kvlab serve does), else when the
    client saw them end (the first chunk of each group of chunks that arrived together,
    grouped to the server's own step count where it exports one)."""
    stream = result.kv_events
    if stream is not None and publishes_every_step(result):
        # the publisher's clock: the client's own for a server on the same machine
        return _increasing([b.ts - stream.started_at for b in stream.batches])
    views = [_one_token_chunks(record) for record in result.requests]
    groups = group_steps(views, server_step_count(result), STEP_GAP_FRACTIONS, causal=True)
    return _increasing(sorted(group[0][0] for group in groups if group))


def publishes_every_step(result: BenchResult) -> bool:
    """Whether the server's stream holds a batch for each step it counted during the run."""
    steps = server_step_count(result)
    if not steps or result.kv_events is None:
        return False
    return len(result.kv_events.batches) >= steps


def _increasing(times: list[float]) -> list[float]:
    """Two steps that came in one read are still two steps, a microsecond apart."""
    ends: list[float] = []
    for time_s in times:
        ends.append(max(time_s, ends[-1] + 1e-6) if ends else time_s)
    return ends


def _one_token_chunks(record: BenchRequest) -> BenchRequest:
    """The request's record with one chunk per token: a chunk that brought n tokens (a server
    that fell behind sent n steps' tokens at once) stands for n steps, the n - 1 before it
    spread evenly since the chunk before."""
    times, previous = [], record.arrival_s
    for time_s, num_tokens in zip(record.chunk_times_s, record.chunk_tokens, strict=True):
        extra = max(0, num_tokens - 1)
        times += [previous + (time_s - previous) * (k + 1) / (extra + 1) for k in range(extra)]
        times.append(time_s)
        previous = time_s
    return dataclasses.replace(record, chunk_times_s=times, chunk_tokens=[1] * len(times))


@dataclass(slots=True)
class Replay:
    """kvlab's side: its prefix-cache changes, steps and preemptions."""

    changes: list[Change]
    num_steps: int
    num_preemptions: int


def replay_changes(result: BenchResult, config: SimConfig,
                   server: list[Change] | None = None, ends: list[float] | None = None
                   ) -> Replay:
    """kvlab's prefix-cache changes over the bench's requests (`replay_trace`, admitted when
    the `server`'s changes say) on `config`, stepped on the server's timeline (`ends`,
    default `server_step_ends`)."""
    if ends is None:
        ends = server_step_ends(result)
    budget = config.scheduler_config().max_num_batched_tokens
    stored_at: dict[int | None, list[float]] = {}
    for change in server or ():
        if change.kind == STORED:
            stored_at.setdefault(change.key, []).append(change.time_s)
    trace = replay_trace(result, ends, budget, config.policy.block_size, stored_at,
                         exact_steps=publishes_every_step(result))
    simulation = Simulation(trace, config)
    log = simulation.manager.events = KVEventLog.for_manager(simulation.manager)
    loop = simulation.loop
    changes: list[Change] = []
    now, step, preemptions = 0.0, 0, 0
    while loop.has_work():
        if not loop.admit(now):
            next_arrival = loop.next_arrival_s()
            if next_arrival is None:
                break
            now = next_arrival
            continue
        output = loop.schedule(now)
        preemptions += len(output.preempted)
        at = bisect.bisect_right(ends, now)
        # Past the server's last step (or where the client saw none), a short step.
        end = ends[at] if at < len(ends) else now + 1e-3
        loop.commit(output, start_s=now, end_s=end, wall_time_s=end - now)
        changes += taken_changes(log, step, end)
        now, step = end, step + 1
    return Replay(changes, step, preemptions)


def taken_changes(log: KVEventLog, step: int, time_s: float) -> list[Change]:
    """The events `log` gathered since last taken, as changes made at `step` by `time_s`."""
    return [Change(e.kind, e.key, step, time_s, e.request_id, group=e.group)
            for e in log.take()]
