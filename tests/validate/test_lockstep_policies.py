"""Lockstep: the simulator replaying the engine's measured step times makes every memory
decision the engine made, for every policy family; a real difference is reported at its step."""

from __future__ import annotations

import dataclasses

import pytest

from kvlab.engine.config import EngineConfig
from kvlab.engine.interleave import run_engine
from kvlab.fidelity import lockstep, sim_config_for
from kvlab.policies.serving import ServingConfig
from kvlab.traces import Trace, TraceRequest

SHARED = (101, 102, 103)


def small_trace() -> Trace:
    """Bursts that overflow a 24-page cache, shared prompt blocks, and an idle gap."""
    requests = [
        TraceRequest(0, 0.0, 30, 12, hash_ids=SHARED, hash_block_size=16),
        TraceRequest(1, 0.0, 20, 10),
        TraceRequest(2, 0.001, 36, 9, hash_ids=(*SHARED[:2], 104), hash_block_size=16),
        TraceRequest(3, 0.001, 9, 14),
        TraceRequest(4, 0.002, 17, 6, hash_ids=SHARED[:2], hash_block_size=16),
        TraceRequest(5, 50.0, 25, 8),
        TraceRequest(6, 50.0, 40, 5, hash_ids=SHARED, hash_block_size=16),
    ]
    return Trace("lockstep", "mooncake", "synthetic", requests, {})


def engine_config(policy: str, num_pages: int = 24, **serving_settings) -> EngineConfig:
    """tiny-llama with a cache small enough to preempt (admission by first chunk, vLLM V0's,
    unless told: the bursts then preempt and swap under every family)."""
    serving_settings.setdefault("scheduler_reserve_full_isl", False)
    serving = ServingConfig.create(
        policy, num_gpu_blocks_override=num_pages, max_model_len=64, max_num_batched_tokens=32,
        **serving_settings,
    )
    return EngineConfig(model="tiny-llama", serving=serving)


@pytest.mark.parametrize(
    "policy, expect",
    [
        ("paged:block_size=4", "preemptions"),
        ("paged:block_size=4,preemption=swap", "swaps"),
        ("paged:block_size=4,eviction=lru", "hits+preemptions"),
        ("paged:block_size=4,eviction=lru,preemption=swap", "swaps"),
        ("buddy:block_size=4,preemption=swap", "swaps"),
        ("paged:block_size=4,block_sizing=geometric", "preemptions"),
        ("paged:block_size=4,preemption=auto", "preemptions"),
        # A contiguous region is reserved whole at admission: it queues, never preempts.
        ("contiguous:block_size=4,reserve=oracle", None),
        ("contiguous:block_size=4,reserve=max", None),
    ],
)
def test_lockstep_is_identical_for_every_policy_family(policy, expect):
    result, engine, ran = run_engine(engine_config(policy), small_trace())
    report = lockstep(result, ran, sim_config_for(engine), engine.preemption_costs)
    assert report.identical, report.describe()
    assert report.num_sim_steps == report.num_engine_steps == len(result.steps)
    counts = {
        "preemptions": sum(r.num_preemptions for r in result.requests),
        "swaps": sum(r.num_swaps_out for r in result.requests),
        "hits": sum(r.num_cached_tokens for r in result.requests),
    }
    if expect is not None:  # the case exercises what it is named for
        assert all(counts[name] > 0 for name in expect.split("+")), counts


def test_lockstep_is_identical_with_the_full_prompt_admission_gate():
    config = engine_config("paged:block_size=4,eviction=lru", scheduler_reserve_full_isl=True)
    result, engine, ran = run_engine(config, small_trace())
    sim_config = sim_config_for(engine)
    assert sim_config.serving.scheduler_reserve_full_isl
    report = lockstep(result, ran, sim_config, engine.preemption_costs)
    assert report.identical, report.describe()


def test_lockstep_reports_the_first_step_and_columns_that_differ():
    result, engine, ran = run_engine(engine_config("paged:block_size=4"), small_trace())
    # A simulator with more pages than the engine: it stops preempting where the engine did.
    config = sim_config_for(engine)
    serving = dataclasses.replace(config.serving, num_gpu_blocks_override=64)
    bigger = dataclasses.replace(config, model=config.model_spec, serving=serving)
    report = lockstep(result, ran, bigger)
    assert not report.identical
    assert report.first_step is not None and "num_free_pages" in report.columns
    assert report.engine_row["num_free_pages"] != report.sim_row["num_free_pages"]
    assert f"step {report.first_step}" in report.describe()
