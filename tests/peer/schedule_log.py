"""The simulator's schedule of a run's requests on vLLM's engine clock, step for step against
the log of vLLM's scheduler (kvlab's plugin with KVLAB_VLLM_STEP_LOG; read and replayed by
kvlab.fidelity.step_log)."""

from __future__ import annotations

from dataclasses import replace

from kvlab.bench import BenchResult
from kvlab.fidelity import server_sim_config
from kvlab.fidelity.from_bench import bench_trace
from kvlab.fidelity.step_log import ScheduleLog, replay_on_engine_clock
from kvlab.policies import SchedulerOutput
from kvlab.sim import SimConfig, Simulation
from kvlab.sim.replayed import ReplayedStepTimes
from kvlab.traces import Trace


def first_difference(ours: list[dict[int, int]], theirs: list[dict[int, int]]) -> int | None:
    """The first step at which two schedules (tokens per request, step by step) differ, over
    the steps both have; None where those are all alike."""
    return next((index for index, (mine, other) in enumerate(zip(ours, theirs, strict=False))
                 if mine != other), None)


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
