"""Trace replay on the engine: synthesized prompt ids that carry the trace's prefix sharing, and
the RunResult the simulator's tools read."""

from __future__ import annotations

import pytest

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.engine.replay import run_trace
from kvlab.errors import KvlabError
from kvlab.metrics import summarize
from kvlab.policies import RequestStatus
from kvlab.policies.serving import ServingConfig
from kvlab.traces import Trace, TraceRequest, synthesize_prompt_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trace(*requests: TraceRequest) -> Trace:
    return Trace("test", "mooncake", "synthetic", list(requests), {"request_rate": 2.0})


def _shared_trace() -> Trace:
    """Requests 0 and 2 share their first 16-token block; request 1 shares nothing."""
    return _trace(
        TraceRequest(0, 0.0, 24, 3, hash_ids=(11, 12), hash_block_size=16),
        TraceRequest(1, 0.5, 10, 2),
        TraceRequest(2, 1.0, 20, 4, hash_ids=(11, 13), hash_block_size=16),
    )


def test_same_hash_id_gives_the_same_block_of_tokens():
    a, b, c = synthesize_prompt_ids(_shared_trace(), vocab_size=1000, seed=0).requests
    assert a.prompt_token_ids[:16] == c.prompt_token_ids[:16]
    assert a.prompt_token_ids[16:20] != c.prompt_token_ids[16:20]
    assert [len(r.prompt_token_ids) for r in (a, b, c)] == [24, 10, 20]


def test_synthesized_ids_are_deterministic_per_seed_and_within_the_vocabulary():
    first = synthesize_prompt_ids(_shared_trace(), vocab_size=50, seed=1)
    again = synthesize_prompt_ids(_shared_trace(), vocab_size=50, seed=1)
    other = synthesize_prompt_ids(_shared_trace(), vocab_size=50, seed=2)
    ids = [r.prompt_token_ids for r in first.requests]
    assert ids == [r.prompt_token_ids for r in again.requests]
    assert ids != [r.prompt_token_ids for r in other.requests]
    assert all(0 <= t < 50 for prompt in ids for t in prompt)


def test_token_ids_a_trace_carries_are_kept_or_refused_outside_the_vocabulary():
    kept = _trace(TraceRequest(0, 0.0, 3, 1, prompt_token_ids=(7, 8, 9)))
    assert synthesize_prompt_ids(kept, 100).requests[0].prompt_token_ids == (7, 8, 9)
    bad = _trace(TraceRequest(0, 0.0, 2, 1, prompt_token_ids=(7, 800)))
    with pytest.raises(KvlabError, match="token id 800 is outside"):
        synthesize_prompt_ids(bad, 100)


def _engine(policy: str) -> LLMEngine:
    """tiny-llama on 64 pages of 4 tokens under `policy`."""
    return LLMEngine(EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        policy, num_gpu_blocks_override=64)))


def test_a_replayed_trace_hits_the_prefix_cache_where_the_trace_shares():
    engine = _engine("paged:block_size=4,eviction=lru")
    trace = synthesize_prompt_ids(_shared_trace(), engine.model_config.vocab_size)
    result = run_trace(engine, trace)
    by_id = {r.request_id: r for r in result.requests}
    assert by_id[2].num_cached_tokens == 16  # the shared block, 4 pages
    assert by_id[1].num_cached_tokens == 0
    assert [by_id[i].num_output_tokens for i in range(3)] == [3, 2, 4]


def test_a_replayed_trace_gives_a_complete_summary():
    engine = LLMEngine(
        EngineConfig(
            model="tiny-llama",
            serving=ServingConfig.create(num_gpu_blocks_override=64, max_model_len=24),
        )
    )
    trace = synthesize_prompt_ids(_shared_trace(), engine.model_config.vocab_size, seed=4)
    result = run_trace(engine, trace)
    summary = summarize(result)
    too_long = next(r for r in result.requests if r.request_id == 0)  # 24 + 3 tokens
    assert too_long.status is RequestStatus.FINISHED_ERROR
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["total_output_tokens"] == 6
    assert summary["backend"] == "engine:cpu" and summary["policy"] == "paged"
    assert summary["request_rate"] == 2.0 and summary["num_prompts"] == 3
    assert summary["kv_cache_size_tokens"] == 64 * 16
    assert len(result.steps) == len(result.steps.columns["num_used_pages"]) > 0


def test_a_second_replay_on_one_engine_reports_its_own_precision_mix():
    """The engine's manager outlives a run: each replay's mix (summary and step columns) is
    its own steps', not the engine's whole life's."""
    engine = _engine("paged:block_size=4,precision=age:recent=4,depth=2")
    trace = synthesize_prompt_ids(_shared_trace(), engine.model_config.vocab_size)
    first, second = run_trace(engine, trace), run_trace(engine, trace)
    assert engine.manager.precision is not None
    assert len(engine.manager.precision.mix) == len(first.steps) + len(second.steps)
    for result in (first, second):
        columns = result.steps.columns
        demoted = sum(columns["num_demotions_to_level_1"])
        assert len(columns["num_demotions_to_level_1"]) == len(result.steps)
        assert 0 < demoted == summarize(result)["precision_demotions_1_fp8_e4m3"]
