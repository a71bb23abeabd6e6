"""vLLM's scheduler log (kvlab's vLLM plugin with `KVLAB_VLLM_STEP_LOG`: the order its engine
queued the requests in, each step's tokens per request, each preemption, on the engine's
clock) and kvlab's manager replayed on it: the KV lockstep's kvlab side with vLLM's own step
boundaries instead of the client's reconstruction of them (`kv_lockstep(..., step_log=...)`).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.errors import KvlabError
from kvlab.fidelity.kv_replay import Replay, taken_changes
from kvlab.policies.kv_events import KVEventLog
from kvlab.sim import Simulation
from kvlab.sim.replayed import ReplayedStepTimes

if TYPE_CHECKING:
    from kvlab.bench import BenchResult
    from kvlab.fidelity.kv_changes import Change
    from kvlab.policies import SchedulerOutput
    from kvlab.sim import SimConfig
    from kvlab.traces import Trace

STEP_LOG_FLAG = "--step-log"


@dataclass
class ScheduleLog:
    """vLLM's scheduler over one run, with its request ids as the trace's (`X-Request-Id`:
    `<prefix><trace id>`, which vLLM wraps as `cmpl-<prefix><trace id>-<index>-<suffix>`)."""

    arrivals: list[int] = field(default_factory=list)  # in the order the engine queued them
    arrival_times_s: list[float] = field(default_factory=list)  # when, on the engine's clock
    steps: list[dict[int, int]] = field(default_factory=list)  # tokens per request, per step
    step_times_s: list[float] = field(default_factory=list)  # when each step was decided
    preemptions: list[tuple[int, int]] = field(default_factory=list)  # (step, request), in order
    prefix: str = ""  # the run's request-id prefix, which names its rows

    def preemptions_per_request(self) -> dict[int, int]:
        """Request id -> times preempted (requests never preempted left out)."""
        counts: dict[int, int] = {}
        for _, request_id in self.preemptions:
            counts[request_id] = counts.get(request_id, 0) + 1
        return counts


def trace_id(vllm_request_id: str, prefix: str) -> int | None:
    """The trace request id inside vLLM's id of a request sent with `prefix` (None for a
    request of another run, whose prefix may contain this one: `burst-` in `burst-mixed-`)."""
    match = re.search(rf"(?:^|-){re.escape(prefix)}(\d+)(?:-|$)", vllm_request_id)
    return int(match.group(1)) if match else None


def step_log_file(stem: Path) -> Path:
    """The log the scheduling process wrote for `KVLAB_VLLM_STEP_LOG=stem`: `stem` itself
    where it is a file, else the one non-empty `stem.<pid>` (the processes that never
    scheduled wrote nothing). Raises KvlabError naming `--step-log` otherwise."""
    if stem.is_file():
        return stem
    paths = sorted(path for path in stem.parent.glob(stem.name + ".*")
                   if path.suffix[1:].isdigit() and path.stat().st_size)
    if not paths:
        raise KvlabError(f"{STEP_LOG_FLAG} {stem}: no log {stem}.<pid> with steps in it; start "
                         f"vLLM with KVLAB_VLLM_STEP_LOG={stem} and kvlab's plugin installed "
                         "beside it (docs/vllm_plugin.md)")
    if len(paths) > 1:
        raise KvlabError(f"{STEP_LOG_FLAG} {stem}: several logs ({', '.join(map(str, paths))}): "
                         "one per vLLM engine that ran; pass the file of the server this run "
                         "was sent to")
    return paths[0]


def read_schedule_log(stem: Path, prefix: str) -> ScheduleLog:
    """The rows of the requests sent with `prefix` in the scheduler's log (`step_log_file`).
    One server's log holds every run sent to it: a run's own rows are those of its prefix.
    Raises KvlabError naming the file and line of a row that is not the plugin's JSON."""
    path = step_log_file(stem)
    log = ScheduleLog(prefix=prefix)
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if prefix not in line:
            continue
        try:
            _add_row(log, json.loads(line), prefix)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise KvlabError(f"{path}:{number}: not a row of kvlab's step log ({error})"
                             ) from None
    return log


def _add_row(log: ScheduleLog, row: dict, prefix: str) -> None:
    """One row of the log into `log`, where every request it names is the run's."""
    ids = [row["add"]] if "add" in row else [row["preempt"]] if "preempt" in row \
        else list(row["tokens"])
    own = [trace_id(vllm_id, prefix) for vllm_id in ids]
    if None in own:  # (a run's steps hold only its own requests)
        return
    ours = [request_id for request_id in own if request_id is not None]
    if "add" in row:
        log.arrivals.append(ours[0])
        log.arrival_times_s.append(float(row["t"]))
    elif "preempt" in row:
        log.preemptions.append((int(row["step"]), ours[0]))
    else:
        log.steps.append(dict(zip(ours, map(int, row["tokens"].values()), strict=True)))
        log.step_times_s.append(float(row["t"]))


def replay_on_engine_clock(trace: Trace, log: ScheduleLog) -> tuple[Trace, list[float]]:
    """`trace` (a bench run's requests: `bench_trace`) as vLLM's engine saw it, and the
    durations that put the simulator's steps where vLLM's were: each request arrives when
    the engine queued it (those queued before the first step, at it), and each step lasts
    until vLLM decided the next (an idle wait included), on the engine's clock from its first
    step. A step starting at t admits what arrived by t, so the simulator's steps see the
    same arrivals as vLLM's; a request the engine never queued (refused by the server's API)
    is left out. Raises KvlabError where the log has no step of the run."""
    if not log.step_times_s:
        raise KvlabError(f"{STEP_LOG_FLAG}: the log has no step of requests named "
                         f"{log.prefix}<id>: is it the log of the server the run was sent to?")
    by_id = {request.request_id: request for request in trace.requests}
    first = log.step_times_s[0]
    requests = [replace(by_id[request_id], arrival_s=max(time_s, first) - first)
                for request_id, time_s in zip(log.arrivals, log.arrival_times_s, strict=True)
                if request_id in by_id]
    starts = [time_s - first for time_s in log.step_times_s]
    durations = [end - start for start, end in itertools.pairwise(starts)] + [1e-3]
    return replace(trace, requests=requests), durations


def check_covers(log: ScheduleLog, result: BenchResult) -> None:
    """Raise KvlabError unless `log` queued every request of `result` the server completed
    (a request the server refused never reaches its scheduler)."""
    completed = {record.request_id for record in result.requests if record.completed}
    missing = sorted(completed - set(log.arrivals))
    if missing:
        raise KvlabError(f"{STEP_LOG_FLAG}: the log names {len(completed) - len(missing)} of "
                         f"the run's {len(completed)} completed requests (not {missing[:3]}"
                         f"{', ...' if len(missing) > 3 else ''}): is it the log of the server "
                         "the run was sent to?")


@dataclass
class EngineClockRun:
    """The simulator's run of a trace on vLLM's engine clock: its prefix-cache changes in the
    manager's order, the tokens per request of each step that scheduled any (as the log keeps
    vLLM's), each request's preemptions and the steps it took."""

    changes: list[Change]
    steps: list[dict[int, int]]
    preempted: dict[int, int]
    num_steps: int

    def as_replay(self) -> Replay:
        """The KV lockstep's kvlab side (`kv_replay.Replay`)."""
        return Replay(self.changes, self.num_steps, sum(self.preempted.values()))


def run_on_engine_clock(trace: Trace, config: SimConfig, durations_s: list[float]
                        ) -> EngineClockRun:
    """Simulate `trace` on `config` with `durations_s` replayed as its steps' lengths
    (`replay_on_engine_clock`), every step through the scheduler (no decode runs), its KV
    events and schedule recorded."""
    simulation = Simulation(trace, config, cost_model=ReplayedStepTimes(durations_s),
                            decode_runs=False)
    events = simulation.manager.events = KVEventLog.for_manager(simulation.manager)
    changes: list[Change] = []
    steps: list[dict[int, int]] = []
    schedule, counter = simulation.scheduler.schedule, itertools.count()

    def scheduled(now_s: float = 0.0) -> SchedulerOutput:
        # (the step before's commit and this step's allocations, in the manager's order)
        output = schedule(now_s)
        changes.extend(taken_changes(events, next(counter), now_s))
        if output.requests:
            steps.append({request.request_id: tokens for request, tokens
                          in zip(output.requests, output.num_new_tokens, strict=True)})
        return output

    simulation.scheduler.schedule = scheduled  # type: ignore[method-assign]
    result = simulation.run()
    step = next(counter)
    changes += taken_changes(events, step, result.duration_s)
    preempted = {r.request_id: r.num_preemptions for r in result.requests if r.num_preemptions}
    return EngineClockRun(changes, steps, preempted, step)


def bench_on_engine_clock(result: BenchResult, log: ScheduleLog, config: SimConfig
                          ) -> EngineClockRun:
    """`run_on_engine_clock` of a bench run's requests (`check_covers`), on `config` (the
    server's), with the server's tokens (output blocks hash as vLLM's)."""
    from kvlab.fidelity.from_bench import bench_trace

    check_covers(log, result)
    replay, durations = replay_on_engine_clock(bench_trace(result, token_ids=True), log)
    return run_on_engine_clock(replay, config, durations)


@dataclass
class ScheduleMatch:
    """kvlab's steps against vLLM's, step for step on vLLM's clock: how many each took,
    the first step whose tokens per request differ (None: none of those both took), and
    whether each request was preempted as often."""

    num_vllm_steps: int
    num_kvlab_steps: int
    first_difference: int | None
    num_vllm_preemptions: int
    num_kvlab_preemptions: int
    preemptions_equal: bool

    @property
    def identical(self) -> bool:
        """Every step and every request's preemptions alike."""
        return (self.first_difference is None and self.preemptions_equal
                and self.num_vllm_steps == self.num_kvlab_steps)


def first_difference(ours: list[dict[int, int]], theirs: list[dict[int, int]]) -> int | None:
    """The first step at which two schedules (tokens per request, step by step) differ, over
    the steps both have; None where those are all alike."""
    return next((index for index, (mine, other) in enumerate(zip(ours, theirs, strict=False))
                 if mine != other), None)


def match_schedule(run: EngineClockRun, log: ScheduleLog) -> ScheduleMatch:
    """`run`'s steps and preemptions against vLLM's (`log`)."""
    theirs = log.preemptions_per_request()
    return ScheduleMatch(len(log.steps), len(run.steps), first_difference(run.steps, log.steps),
                         len(log.preemptions), sum(run.preempted.values()),
                         run.preempted == theirs)
