"""The engine decides exactly as the simulator does when the simulator is given the engine's
measured step times: same steps, same batches, same memory, same stamps (lockstep)."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.engine.replay import run_trace, synthesize_prompt_ids
from kvlab.policies.records import INT_COLUMNS
from kvlab.sim import SimConfig, simulate
from kvlab.traces import Trace, TraceRequest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class ReplayedStepTimes:
    """A simulator cost model that charges each step what the engine measured for it."""

    def __init__(self, durations: list[float]) -> None:
        self._durations = iter(durations)

    def step_time_s(self, shape) -> float:
        return next(self._durations)

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        return 0.0

    def copy_time_s(self, num_pages: int) -> float:
        return 0.0

    def recompute_time_s(self, num_tokens: int) -> float:
        return float(num_tokens)


def _trace() -> Trace:
    """Shared and private prompts, bursts and an idle gap, on a cache that must preempt."""
    shared = (101, 102, 103)
    requests = [
        TraceRequest(0, 0.0, 30, 12, hash_ids=shared, hash_block_size=16),
        TraceRequest(1, 0.0, 20, 10),
        TraceRequest(2, 0.001, 36, 9, hash_ids=(*shared[:2], 104), hash_block_size=16),
        TraceRequest(3, 0.001, 9, 14),
        TraceRequest(4, 0.002, 17, 6, hash_ids=shared[:2], hash_block_size=16),
        TraceRequest(5, 50.0, 25, 8),
        TraceRequest(6, 50.0, 40, 5, hash_ids=shared, hash_block_size=16),
    ]
    return Trace("lockstep", "mooncake", "synthetic", requests, {})


def test_the_simulator_replaying_engine_step_times_makes_the_same_decisions():
    policy = "paged:block_size=4,eviction=lru"
    engine = LLMEngine(
        EngineConfig(
            model="tiny-llama",
            policy=policy,
            num_gpu_blocks_override=24,
            max_model_len=64,
            max_num_batched_tokens=32,
        )
    )
    trace = synthesize_prompt_ids(_trace(), engine.model_config.vocab_size)
    real = run_trace(engine, trace)
    measured = list(real.steps.columns["wall_time_s"])
    config = SimConfig(
        policy=policy,
        num_gpu_blocks_override=24,
        max_model_len=64,
        max_num_batched_tokens=32,
    )
    sim = simulate(trace, config, cost_model=ReplayedStepTimes(measured))

    assert sum(r.num_preemptions for r in real.requests) > 0
    assert sum(r.num_cached_tokens for r in real.requests) > 0
    real_cols, sim_cols = real.steps.columns, sim.steps.columns
    for name in ("start_s", "duration_s", *INT_COLUMNS):
        assert list(real_cols[name]) == list(sim_cols[name]), name
    for a, b in zip(real.requests, sim.requests, strict=True):
        assert (a.request_id, a.status, a.num_preemptions, a.num_cached_tokens) == (
            b.request_id,
            b.status,
            b.num_preemptions,
            b.num_cached_tokens,
        )
        assert (a.first_token_s, a.finish_s) == (b.first_token_s, b.finish_s)
    np.testing.assert_array_equal(real.itls_s, sim.itls_s)
