"""SimConfig: KV sizing, policy options, limits; trace conversion; compare."""

import pytest
from sim_workloads import make_trace

from kvlab.errors import KvlabError
from kvlab.metrics import summarize
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig, compare, simulate, to_requests
from kvlab.specs import get_hardware, get_model, kv_cache_capacity_tokens
from kvlab.traces import Trace, TraceRequest, load_trace

TRACE = make_trace([(100, 10), (200, 5)])


def test_kv_pages_are_sized_like_vllm_from_memory_utilisation():
    result = simulate(TRACE, SimConfig(serving=ServingConfig(gpu_memory_utilization=0.5)))
    expected = kv_cache_capacity_tokens(
        get_model("llama-2-7b"),
        get_hardware("a100-80g"),
        page_size=16,
        gpu_memory_utilization=0.5,
    )
    assert result.num_total_pages == expected.num_pages
    assert result.kv_cache_size_tokens == expected.num_tokens
    assert result.num_total_pages < simulate(TRACE, SimConfig()).num_total_pages


def test_num_gpu_blocks_override_sets_the_page_count():
    serving = ServingConfig.create("paged:block_size=32", num_gpu_blocks_override=77)
    result = simulate(TRACE, SimConfig(serving=serving))
    assert (result.num_total_pages, result.page_size, result.kv_cache_size_tokens) == (77, 32, 2464)


def test_kv_cache_memory_bytes_sizes_the_simulated_cache():
    serving = ServingConfig.create("paged:block_size=32", kv_cache_memory_bytes=64 * 2**20)
    result = simulate(TRACE, SimConfig(serving=serving))
    assert result.num_total_pages == 64 * 2**20 // (32 * 512 * 1024)  # 4
    assert result.metadata["kv_cache_memory_bytes"] == 64 * 2**20


def test_prefix_caching_turns_no_eviction_into_lru_but_keeps_a_chosen_one():
    assert ServingConfig.create(enable_prefix_caching=True).policy.eviction == "lru"
    chosen = ServingConfig.create("paged:eviction=fifo", enable_prefix_caching=True)
    assert chosen.policy.eviction == "fifo"


def test_prefix_caching_serves_shared_prompt_prefixes():
    trace = load_trace(
        "random", num_prompts=40, random_input_len=64, random_output_len=4, random_prefix_len=256
    )
    cached = SimConfig(serving=ServingConfig.create(enable_prefix_caching=True))
    with_cache = summarize(simulate(trace, cached))
    without = summarize(simulate(trace, SimConfig()))
    assert with_cache["prefix_cache_hit_rate_perc"] > 50.0
    assert without["prefix_cache_hit_rate_perc"] == 0.0


def test_max_model_len_defaults_to_the_models_and_cannot_exceed_it():
    assert SimConfig(model="llama-3.1-8b").max_model_len == 131072
    with pytest.raises(KvlabError, match="max_model_len is 5000; expected 1 to 4096") as err:
        SimConfig(serving=ServingConfig(max_model_len=5000))
    assert err.value.parameters == ("max_model_len",)


def test_a_bad_policy_spec_fails_when_the_config_is_made():
    with pytest.raises(KvlabError, match="unknown kind"):
        SimConfig(serving=ServingConfig.create("pages"))


def test_trace_requests_become_scheduler_requests_with_their_prompt_identity():
    trace = Trace(
        "t",
        "sharegpt",
        "synthetic",
        [
            TraceRequest(0, 0.5, 3, 7, prompt_token_ids=(5, 6, 7)),
            TraceRequest(1, 0.75, 600, 2, hash_ids=(9, 10), hash_block_size=512),
        ],
    )
    first, second = to_requests(trace)
    assert (first.prompt_len, first.max_output_tokens, first.arrival_s) == (3, 7, 0.5)
    assert first.prompt_token_ids == [5, 6, 7]
    assert (second.hash_ids, second.hash_block_size) == ((9, 10), 512)


def test_compare_runs_each_policy_on_the_same_trace_in_order():
    results = compare(TRACE, SimConfig(), ["paged", "buddy", "paged:block_size=64"])
    assert [r.metadata["policy"] for r in results] == ["paged", "buddy", "paged:block_size=64"]
    assert all(len(r.requests) == 2 for r in results)


def test_results_carry_the_run_description():
    metadata = simulate(TRACE, SimConfig(serving=ServingConfig(seed=3))).metadata
    assert metadata["backend"] == "sim"
    assert (metadata["model"], metadata["hardware"], metadata["seed"]) == (
        "llama-2-7b",
        "a100-80g",
        3,
    )
    assert metadata["dataset"] == "hand-made" and metadata["num_prompts"] == 2
