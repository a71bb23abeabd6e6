"""The simulator's schedule of a bench run against the peer on vLLM's engine clock, with what
the peer tests vary beyond `kvlab validate --step-log`'s replay (kvlab.fidelity.step_log): the
trace's hash ids instead of the server's tokens, the priorities sent, the server's scheduling
policy."""

from __future__ import annotations

from dataclasses import replace

from kvlab.bench import BenchResult
from kvlab.fidelity import server_sim_config
from kvlab.fidelity.from_bench import bench_trace
from kvlab.fidelity.step_log import ScheduleLog, replay_on_engine_clock, run_on_engine_clock
from kvlab.traces import Trace


def preset_on_engine_clock(result: BenchResult, log: ScheduleLog, *, token_ids: bool = False,
                           model: str = "tiny-llama", sent: Trace | None = None,
                           scheduling_policy: str | None = None,
                           ) -> tuple[list[dict[int, int]], dict[int, int]]:
    """The simulator's steps (tokens per request of each step that scheduled any) and request
    id -> times preempted, over a bench run against the peer, under the `vllm` preset with the
    server's configuration, replayed on vLLM's engine clock (`run_on_engine_clock`).
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
    run = run_on_engine_clock(replay, config, durations)
    return run.steps, run.preempted
