"""Reading the log of vLLM's scheduler that tests/peer/schedule_hook writes: the order its
engine queued the requests in, each step's tokens per request, and each preemption; and the
simulator's schedule of the same requests on vLLM's engine clock (lockstep against vLLM)."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

from kvlab.bench import BenchResult
from kvlab.fidelity import server_sim_config
from kvlab.fidelity.from_bench import bench_trace
from kvlab.fidelity.kv_changes import Change
from kvlab.fidelity.kv_replay import taken_changes
from kvlab.policies import SchedulerOutput
from kvlab.policies.kv_events import KVEventLog
from kvlab.sim import SimConfig, Simulation
from kvlab.sim.replayed import ReplayedStepTimes
from kvlab.traces import Trace


@dataclass
class ScheduleLog:
    """vLLM's scheduler over one run, with its request ids as the trace's (`X-Request-Id`:
    `<prefix><trace id>`, which vLLM wraps as `cmpl-<prefix><trace id>-<index>-<suffix>`)."""

    arrivals: list[int] = field(default_factory=list)  # in the order the engine queued them
    arrival_times_s: list[float] = field(default_factory=list)  # when, on the engine's clock
    steps: list[dict[int, int]] = field(default_factory=list)  # tokens per request, per step
    step_times_s: list[float] = field(default_factory=list)  # when each step was decided
    preemptions: list[tuple[int, int]] = field(default_factory=list)  # (step, request), in order

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


def read_schedule_log(stem: Path, prefix: str) -> ScheduleLog:
    """The requests sent with `prefix` in the log of the process that scheduled (the files are
    `<stem>.<pid>`; other processes that imported the scheduler wrote nothing). One server's
    log holds every run sent to it: a run's own rows are those of its prefix."""
    paths = [path for path in stem.parent.glob(stem.name + ".*") if path.stat().st_size]
    assert len(paths) == 1, f"expected one scheduler log beside {stem}, found {paths}"
    log = ScheduleLog()
    for line in paths[0].read_text().splitlines():
        if prefix not in line:
            continue
        row = json.loads(line)
        ids = [row["add"]] if "add" in row else [row["preempt"]] if "preempt" in row \
            else list(row["tokens"])
        own = [trace_id(vllm_id, prefix) for vllm_id in ids]
        if None in own:  # (a run's steps hold only its own requests)
            continue
        if "add" in row:
            log.arrivals.append(cast(int, own[0]))
            log.arrival_times_s.append(row["t"])
        elif "preempt" in row:
            log.preemptions.append((row["step"], cast(int, own[0])))
        else:
            log.steps.append(dict(zip(cast(list[int], own), row["tokens"].values(),
                                      strict=True)))
            log.step_times_s.append(row["t"])
    return log


def first_difference(ours: list[dict[int, int]], theirs: list[dict[int, int]]) -> int | None:
    """The first step at which two schedules (tokens per request, step by step) differ, over
    the steps both have; None where those are all alike."""
    return next((index for index, (mine, other) in enumerate(zip(ours, theirs, strict=False))
                 if mine != other), None)


def replay_on_engine_clock(trace: Trace, log: ScheduleLog) -> tuple[Trace, list[float]]:
    """`trace` (a bench run's requests: `bench_trace`) as vLLM's engine saw it, and the
    durations that put the simulator's steps where vLLM's were: each request arrives when
    the engine queued it (those queued before the first step, at it), and each step lasts
    until vLLM decided the next (an idle wait included), on the engine's clock from its first
    step. A step starting at t admits what arrived by t, so the simulator's steps see the
    same arrivals as vLLM's."""
    first = log.step_times_s[0]
    by_id = {request.request_id: request for request in trace.requests}
    requests = [replace(by_id[request_id], arrival_s=max(time_s, first) - first)
                for request_id, time_s in zip(log.arrivals, log.arrival_times_s, strict=True)]
    starts = [time_s - first for time_s in log.step_times_s]
    durations = [end - start for start, end in itertools.pairwise(starts)] + [1e-3]
    return replace(trace, requests=requests), durations


def simulated_schedule(trace: Trace, config: SimConfig, durations_s: list[float]
                       ) -> tuple[list[dict[int, int]], dict[int, int]]:
    """The simulator's steps on `trace` with `durations_s` replayed: tokens per request of each
    step that scheduled any (as the log keeps vLLM's), and request id -> times preempted."""
    simulation = Simulation(trace, config, cost_model=ReplayedStepTimes(durations_s),
                            decode_runs=False)  # every step through `schedule`
    steps: list[dict[int, int]] = []
    schedule = simulation.scheduler.schedule

    def recorded(now_s: float = 0.0) -> SchedulerOutput:
        output = schedule(now_s)
        if output.requests:
            steps.append({request.request_id: tokens for request, tokens
                          in zip(output.requests, output.num_new_tokens, strict=True)})
        return output

    simulation.scheduler.schedule = recorded  # type: ignore[method-assign]
    result = simulation.run()
    preempted = {r.request_id: r.num_preemptions for r in result.requests if r.num_preemptions}
    return steps, preempted


def preset_on_engine_clock(result: BenchResult, log: ScheduleLog, *, token_ids: bool = False,
                           model: str = "tiny-llama", sent: Trace | None = None,
                           scheduling_policy: str | None = None,
                           ) -> tuple[list[dict[int, int]], dict[int, int]]:
    """`simulated_schedule` of a bench run against the peer, under the `vllm` preset with the
    server's configuration, replayed on vLLM's engine clock (`replay_on_engine_clock`).
    `token_ids`: prompts and outputs as the server's tokens (`bench_trace`), so that output
    blocks are cached and hashed as vLLM's (needed where prefix caching meets preemptions).
    `model`: the peer's model (a preset name or the served model folder). `sent`: the trace
    sent, whose priorities the replay takes (a bench record keeps none); `scheduling_policy`:
    the server's `--scheduling-policy` (which its /metrics do not tell)."""
    served = bench_trace(result, token_ids=token_ids)
    if sent is not None:
        priority = {r.request_id: r.priority for r in sent.requests}
        served = replace(served, requests=[replace(r, priority=priority[r.request_id])
                                           for r in served.requests])
    replay, durations = replay_on_engine_clock(served, log)
    config = server_sim_config(result.server, model,
                               overrides={"scheduling_policy": scheduling_policy})
    return simulated_schedule(replay, config, durations)


def kv_changes_on_engine_clock(result: BenchResult, log: ScheduleLog, model: str
                               ) -> list[Change]:
    """kvlab's prefix-cache changes over a bench run against the peer (its KV events on),
    replayed under the `vllm` preset on vLLM's engine clock (`replay_on_engine_clock`, the
    server's tokens: output blocks hash as vLLM's), in the order the manager made them: the
    KV lockstep's kvlab side without the client's reconstruction of vLLM's steps. `model`:
    the peer's model (a preset name or the served model folder)."""
    replay, durations = replay_on_engine_clock(bench_trace(result, token_ids=True), log)
    config = server_sim_config(result.server, model)
    simulation = Simulation(replay, config, cost_model=ReplayedStepTimes(durations),
                            decode_runs=False)
    events = simulation.manager.events = KVEventLog.for_manager(simulation.manager)
    changes: list[Change] = []
    schedule, steps = simulation.scheduler.schedule, itertools.count()

    def scheduled(now_s: float = 0.0) -> SchedulerOutput:
        # (the step before's commit and this step's allocations, in the manager's order)
        output = schedule(now_s)
        changes.extend(taken_changes(events, next(steps), now_s))
        return output

    simulation.scheduler.schedule = scheduled  # type: ignore[method-assign]
    end_s = simulation.run().duration_s
    return changes + taken_changes(events, next(steps), end_s)
