"""Engines stepped in turns of CPU time, so that runs of different sizes meet the same machine
(`kvlab validate` measures its calibration run alongside the validated one)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.engine.replay import trace_requests, trace_result, with_outputs
from kvlab.heap import frozen_heap
from kvlab.metrics import RunResult
from kvlab.traces import synthesize_prompt_ids

if TYPE_CHECKING:
    from kvlab.traces import Trace

# CPU time an engine runs before `run_engines` may switch to another. The first step after a
# switch runs on caches the other engine filled and costs more; with one step per turn the
# engine with fewer steps met that on every step and the other on a third of them (a 4% bias
# between calibration and validated run at 4 ms steps). Turns of tens of steps make that cost
# small and equal, and are still far shorter than the machine's changes of speed.
TURN_S = 0.1


def run_engine(
    config: EngineConfig, trace: Trace, on_step: Callable[[int], object] | None = None
) -> tuple[RunResult, LLMEngine, Trace]:
    """A fresh engine from `config` serving `trace` on the virtual clock; returns the run, the
    engine and the trace with the prompt ids it ran (synthesised from the config's seed) and
    the output ids it sampled. `on_step` is told after every step how many requests it ended
    (a progress bar's update)."""
    return run_engines(config, [trace], on_step)[0]


def run_engines(
    config: EngineConfig,
    traces: Sequence[Trace],
    on_step: Callable[[int], object] | None = None,
) -> list[tuple[RunResult, LLMEngine, Trace]]:
    """One fresh engine per trace, all built from `config`, stepped in turns (`TURN_S` of CPU
    time) on their virtual clocks: next is the engine that has spent the least time per request
    of its trace so far, so that runs of different sizes start and end together.

    Their steps interleave over the same stretch of real time, so every run meets the same
    machine: on a shared or virtual CPU the speed of a core can change by tens of percent from
    one second to the next (other tenants, other processes), and two runs taken one after the
    other can each meet a different machine. Each engine measures only its own steps. All the
    engines are alive at once: on an accelerator their KV caches must fit together. `on_step`
    is told after every step of any engine how many requests it ended.
    """
    engines = [LLMEngine(config) for _ in traces]
    ran = [
        synthesize_prompt_ids(trace, engine.model_config.vocab_size, config.serving.seed)
        for trace, engine in zip(traces, engines, strict=True)
    ]
    runs = [
        engine.iter_run(trace_requests(engine, trace), replay="fast")
        for engine, trace in zip(engines, ran, strict=True)
    ]
    spent_s = [0.0] * len(runs)
    shares = [max(len(trace), 1) for trace in ran]
    done: dict[int, Any] = {}
    with frozen_heap():
        while len(done) < len(runs):
            index = min(
                (i for i in range(len(runs)) if i not in done),
                key=lambda i: spent_s[i] / shares[i],
            )
            turn_end_s = spent_s[index] + TURN_S
            while index not in done:  # at least one step, then until the turn is used
                started = time.thread_time()
                try:
                    num_ended = next(runs[index])
                except StopIteration as stop:
                    done[index], num_ended = stop.value, 0
                spent_s[index] += time.thread_time() - started
                if on_step is not None:
                    on_step(num_ended)
                if spent_s[index] >= turn_end_s:
                    break
    return [
        (trace_result(engine, trace, done[i], "fast"), engine,
         with_outputs(trace, done[i].requests))
        for i, (engine, trace) in enumerate(zip(engines, ran, strict=True))
    ]
