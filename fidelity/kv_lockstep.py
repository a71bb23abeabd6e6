"""KV lockstep against a server: kvlab's manager replays a benchmark's requests and its
prefix-cache changes are compared, block by block and in order, with the KV events the server
published during the run (vLLM's BlockStored / BlockRemoved).

Blocks are compared by content, since the two sides hash differently: a server block's key is
kvlab's page hash (`hash_page`) chained over the token ids its BlockStored carried, found
again for its BlockRemoved through the server's own hash. The replay runs the server's
configuration (block size, blocks, the `vllm` scheduling preset) on the server's timeline: each
step ends when the client saw the server's next step end (the streamed chunks that arrived
together), and each request arrives when the client sent it, so that requests join the same
steps they joined on the server. The two event sequences are aligned (longest matching
subsequence); every event left unmatched is classified so the report says why.

A model with several KV-cache groups (sliding-window layers: vLLM's hybrid KV cache manager)
caches blocks per group: a change is a (kind, group, content key) on both sides, the server's
group its events' `group_idx` (vLLM 0.32; 0 where a server sends none), kvlab's its events'
`group` (`kvlab.policies.kv_events`). Groups are numbered in vLLM's order on both sides
(`kvlab.specs.kv_layout.kv_cache_groups`).
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvlab.bench.observed import series_increase
from kvlab.errors import KvlabError
from kvlab.fidelity.from_bench import (
    GAP_FRACTIONS,
    group_steps,
    served_request,
    server_step_count,
)
from kvlab.policies.kv_events import CLEARED, REMOVED, STORED, KVEventLog
from kvlab.policies.request import hash_page
from kvlab.sim.simulator import Simulation
from kvlab.traces import Trace, TraceRequest

if TYPE_CHECKING:
    from kvlab.bench import BenchRequest, BenchResult
    from kvlab.bench.kv_event_stream import KVEventStream
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
KINDS = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": CLEARED}
# Why an event has no partner on the other side (the report's explanations).
WHY = {
    "moved": "the other side made the same change at another point of the sequence (a step "
             "boundary the client saw differently, or a different preemption)",
    "duplicate": "the server cached a second copy of content it already held (two requests "
                 "computed the same block in one step; kvlab keeps one copy)",
    "unknown": "a block the subscription never saw stored (the server cached it before the "
               "run began: reset its cache first, --reset-prefix-cache)",
    "sparse": "a block of a run the server cached sparsely (its BlockStored names fewer "
              "blocks than its tokens fill, so which block each name is stays unknown: "
              "vLLM's prefix_cache_retention_interval, default 0 in 0.32, which kvlab "
              "replays as the server exports it; compare the stored and removed counts, or "
              "start vLLM with --prefix-cache-retention-interval None for block by block)",
    "server-only": "only the server made this change",
    "kvlab-only": "only kvlab made this change (for a stored block: the server may have held "
                  "it cached from before the run)",
}


@dataclass(slots=True, frozen=True)
class Change:
    """One block entering or leaving a prefix cache: `key` is its content key (None where the
    server's event cannot be keyed), `step` the step (kvlab) or batch (server) that made it,
    `time_s` when (on the run's clock), `request_id` the request whose block it is where
    known, `group` the KV-cache group whose cache it is in; `sparse`: a server block of a run
    cached sparsely (its key unknown)."""

    kind: str
    key: int | None
    step: int
    time_s: float
    request_id: int | None = None
    duplicate: bool = False
    group: int = 0
    sparse: bool = False

    @property
    def item(self) -> tuple[str, int, int | None]:
        """What the alignment compares: (kind, group, content key)."""
        return self.kind, self.group, self.key


@dataclass(slots=True)
class KVLockstepReport:
    """How the server's and kvlab's prefix-cache changes line up.

    `match_rate` is the share of changes matched in order, over the longer of the two
    sequences; `first_divergence` describes the first place they part; `unmatched` counts the
    changes left without a partner by cause (`WHY`).
    """

    num_server: int
    num_kvlab: int
    num_matched: int
    server_counts: dict[str, int]
    kvlab_counts: dict[str, int]
    unmatched: dict[str, int] = field(default_factory=dict)
    first_divergence: dict[str, Any] | None = None
    moved_median_s: float | None = None  # how far apart a moved change's two sides are
    num_replay_steps: int = 0
    num_server_batches: int = 0
    num_server_preemptions: int | None = None  # the server's counter, when it exports one
    num_kvlab_preemptions: int = 0

    @property
    def match_rate(self) -> float:
        """Matched changes over the longer sequence (1.0 when both are empty)."""
        longest = max(self.num_server, self.num_kvlab)
        return self.num_matched / longest if longest else 1.0

    @property
    def identical(self) -> bool:
        """Every change matched, in order."""
        return self.num_matched == self.num_server == self.num_kvlab

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields, the match rate and the causes' meanings included."""
        document = dataclasses.asdict(self)
        document.update(match_rate=self.match_rate, identical=self.identical,
                        causes={cause: WHY[cause] for cause in self.unmatched})
        return document


def server_changes(stream: KVEventStream) -> list[Change]:
    """The stream's events as per-block changes keyed by content, in publishing order, each
    in the KV-cache group its event names (`group_idx`, 0 where absent)."""
    # The server's hash -> content key. vLLM hashes a block's content alike in every group
    # (the group is not part of the published hash), so one map serves all groups.
    by_hash: dict[Any, int] = {}
    sparse: set[Any] = set()  # server hashes of blocks stored sparsely (content unknown)
    held: Counter[tuple[int, int]] = Counter()  # (group, content key) -> copies held
    changes: list[Change] = []
    for index, batch in enumerate(stream.batches):
        for event in batch.events:
            kind = KINDS[event["type"]]
            if kind == CLEARED:
                changes.append(Change(CLEARED, 0, index, batch.recv_s))
                held.clear()
            elif kind == STORED:
                changes.extend(_stored(event, by_hash, sparse, held, index, batch.recv_s))
            else:
                group = int(event.get("group_idx") or 0)
                for server_hash in event["block_hashes"]:
                    server_hash = _hashable(server_hash)
                    key = by_hash.get(server_hash)
                    duplicate = key is not None and held[group, key] > 1
                    if key is not None and held[group, key]:
                        held[group, key] -= 1
                    changes.append(Change(REMOVED, key, index, batch.recv_s, None, duplicate,
                                          group, key is None and server_hash in sparse))
    return changes


def _stored(event: dict[str, Any], by_hash: dict[Any, int], sparse: set[Any],
            held: Counter[tuple[int, int]], index: int, time_s: float) -> list[Change]:
    block_size, tokens = int(event["block_size"]), event["token_ids"]
    hashes = [_hashable(server_hash) for server_hash in event["block_hashes"]]
    group = int(event.get("group_idx") or 0)
    if len(tokens) != len(hashes) * block_size:
        # Masked blocks (vLLM's sparse retention) are left out of the hashes but not of the
        # tokens: which tokens each named block holds is unknown.
        sparse.update(hashes)
        return [Change(STORED, None, index, time_s, group=group, sparse=True) for _ in hashes]
    parent_hash = event.get("parent_block_hash")
    parent: int | None = 0 if parent_hash is None else by_hash.get(_hashable(parent_hash))
    changes = []
    for number, server_hash in enumerate(hashes):
        key = None
        if parent is not None:
            key = hash_page(parent, tokens[number * block_size:(number + 1) * block_size])
            by_hash[server_hash] = key
            held[group, key] += 1
        changes.append(Change(STORED, key, index, time_s, None,
                              key is not None and held[group, key] > 1, group))
        parent = key
    return changes


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


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
        changes.extend(Change(e.kind, e.key, step, end, e.request_id, group=e.group)
                       for e in log.take())
        now, step = end, step + 1
    return Replay(changes, step, preemptions)


def compare_changes(server: list[Change], kvlab: list[Change]) -> KVLockstepReport:
    """Align the two sequences of changes and report the matches, the first divergence and
    the cause of every unmatched change."""
    server_seq = [c.item for c in server]
    kvlab_seq = [c.item for c in kvlab]
    matcher = difflib.SequenceMatcher(None, server_seq, kvlab_seq, autojunk=False)
    blocks = matcher.get_matching_blocks()
    matched_server: set[int] = set()
    matched_kvlab: set[int] = set()
    for block in blocks:
        matched_server.update(range(block.a, block.a + block.size))
        matched_kvlab.update(range(block.b, block.b + block.size))
    report = KVLockstepReport(
        num_server=len(server), num_kvlab=len(kvlab),
        num_matched=sum(block.size for block in blocks),
        server_counts=dict(Counter(c.kind for c in server)),
        kvlab_counts=dict(Counter(c.kind for c in kvlab)),
    )
    left_server = Counter(s for i, s in enumerate(server_seq) if i not in matched_server)
    left_kvlab: Counter[tuple[str, int, int | None]] = Counter(
        k for j, k in enumerate(kvlab_seq) if j not in matched_kvlab)
    causes: Counter[str] = Counter()
    for i, change in enumerate(server):
        if i not in matched_server:
            causes[_server_cause(change, left_kvlab)] += 1
    for j, item in enumerate(kvlab_seq):
        if j not in matched_kvlab:
            causes["moved" if left_server[item] else "kvlab-only"] += 1
    report.unmatched = dict(causes)
    report.moved_median_s = _moved_median_s(
        [c for i, c in enumerate(server) if i not in matched_server],
        [c for j, c in enumerate(kvlab) if j not in matched_kvlab])
    report.first_divergence = _first_divergence(matcher, server, kvlab)
    return report


def _moved_median_s(server: list[Change], kvlab: list[Change]) -> float | None:
    """The median time between the two sides of a change each made elsewhere (paired in
    order), None when there is none."""
    times: dict[tuple[str, int, int | None], list[float]] = {}
    for change in kvlab:
        times.setdefault(change.item, []).append(change.time_s)
    gaps = []
    for change in server:
        other = times.get(change.item)
        if other:
            gaps.append(abs(other.pop(0) - change.time_s))
    return float(statistics.median(gaps)) if gaps else None


def _server_cause(change: Change, left_kvlab: Counter) -> str:
    if change.key is None:
        return "sparse" if change.sparse else "unknown"
    if change.duplicate:
        return "duplicate"
    return "moved" if left_kvlab[change.item] else "server-only"


def _first_divergence(matcher: difflib.SequenceMatcher, server: list[Change],
                      kvlab: list[Change]) -> dict[str, Any] | None:
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        return {"server_index": i1, "kvlab_index": j1,
                "server": _describe(server[i1:i2][:3]), "kvlab": _describe(kvlab[j1:j2][:3]),
                "num_server": i2 - i1, "num_kvlab": j2 - j1}
    return None


def _describe(changes: list[Change]) -> list[dict[str, Any]]:
    return [{"kind": c.kind, "key": None if c.key is None else f"{c.key:016x}",
             "group": c.group, "step": c.step, "time_s": round(c.time_s, 6),
             "request_id": c.request_id} for c in changes]


def kv_lockstep(result: BenchResult, config: SimConfig) -> KVLockstepReport:
    """Replay the bench's requests through kvlab's manager on `config` (the server's
    configuration, e.g. `server_sim_config(info, model, preset="vllm")`) and compare its
    prefix-cache changes with the server's KV events (`result.kv_events`)."""
    if result.kv_events is None:
        raise KvlabError("the bench result has no KV event stream: run `kvlab bench serve` "
                         "with --kv-events", parameters=("kv_events",))
    server = server_changes(result.kv_events)
    ends = server_step_ends(result)
    if publishes_every_step(result):  # a change happened at its batch's step end, exactly
        server = [dataclasses.replace(c, time_s=ends[c.step]) for c in server]
    while server and server[0].kind == CLEARED:  # a reset before the run: kvlab starts empty too
        server.pop(0)
    replay = replay_changes(result, config, server, ends)
    owners = _block_owners(replay.changes)  # names the server's blocks by who stored them
    server = [dataclasses.replace(c, request_id=owners.get(c.key)) for c in server]
    report = compare_changes(server, replay.changes)
    report.num_replay_steps = replay.num_steps
    report.num_kvlab_preemptions = replay.num_preemptions
    report.num_server_batches = len(result.kv_events.batches)
    preemptions = series_increase(result.series, "num_preemptions_total")
    report.num_server_preemptions = None if preemptions is None else int(preemptions)
    return report


def _block_owners(changes: list[Change]) -> dict[int | None, int | None]:
    """Content key -> the request that first stored it (kvlab side): names the server's
    blocks in the report."""
    owners: dict[int | None, int | None] = {}
    for change in changes:
        if change.kind == STORED:
            owners.setdefault(change.key, change.request_id)
    return owners


def format_kv_lockstep(report: KVLockstepReport) -> str:
    """The report's text section."""
    def counts(values: dict[str, int]) -> str:
        return ", ".join(f"{values.get(kind, 0)} {kind}" for kind in (STORED, REMOVED))

    lines = [
        f"{' KV lockstep (server events vs kvlab) ':=^50}",
        f"{'Server block changes:':<40} {report.num_server:<10} ({counts(report.server_counts)})",
        f"{'kvlab block changes:':<40} {report.num_kvlab:<10} ({counts(report.kvlab_counts)})",
        f"{'Matched in order:':<40} {report.num_matched:<10}",
        f"{'Match rate (%):':<40} {100 * report.match_rate:<10.2f}",
        f"{'Server batches / kvlab steps:':<40} {report.num_server_batches} / "
        f"{report.num_replay_steps}",
        f"{'Preemptions server / kvlab:':<40} "
        f"{'?' if report.num_server_preemptions is None else report.num_server_preemptions}"
        f" / {report.num_kvlab_preemptions}",
    ]
    for cause, number in sorted(report.unmatched.items(), key=lambda kv: -kv[1]):
        apart = (f"; median {report.moved_median_s * 1e3:.1f} ms apart"
                 if cause == "moved" and report.moved_median_s is not None else "")
        lines.append(f"  unmatched, {cause}: {number} ({WHY[cause]}{apart})")
    first = report.first_divergence
    if first is None:
        lines.append("Every block change matched, in order.")
    else:
        lines.append(f"First divergence at server change {first['server_index']}, kvlab change "
                     f"{first['kvlab_index']}:")
        lines.append("  server: " + _line(first["server"], first["num_server"], "batch"))
        lines.append("  kvlab:  " + _line(first["kvlab"], first["num_kvlab"], "step"))
    return "\n".join(lines)


def _line(changes: list[dict[str, Any]], total: int, unit: str) -> str:
    if not changes:
        return "nothing here"
    text = "; ".join(
        f"{c['kind']} block {c['key'] or '?'}{_group_label(c)} (request {c['request_id']}, "
        f"{unit} {c['step']}, t={c['time_s']:.3f}s)" for c in changes)
    return text + (f"; ... {total} in all" if total > len(changes) else "")


def _group_label(change: dict[str, Any]) -> str:
    """` in group G` for a block of a group other than the first (a hybrid model's)."""
    group = change.get("group", 0)
    return f" in group {group}" if group else ""
