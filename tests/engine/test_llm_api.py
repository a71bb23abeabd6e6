"""The `LLM` offline API: inputs, per-request parameters, outputs in vLLM's shape, determinism."""

from __future__ import annotations

import dataclasses

import pytest

from kvlab.engine import LLM, SamplingParams
from kvlab.errors import KvlabError

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny-llama", block_size=4, num_gpu_blocks_override=128, verbose=False)


def _prompts() -> list[list[int]]:
    return [[5, 6, 7], list(range(10, 40)), [100] * 12, list(range(200, 209))]


def test_outputs_keep_the_order_of_the_prompts(llm):
    prompts = _prompts()
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    batch = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [out.prompt_token_ids for out in batch] == prompts
    assert [out.outputs[0].token_ids for out in batch] == alone


def test_one_sampling_params_per_prompt_sets_each_output_length(llm):
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 4, 9, 2)]
    outputs = llm.generate(_prompts(), params, use_tqdm=False)
    assert [len(out.outputs[0].token_ids) for out in outputs] == [1, 4, 9, 2]
    assert all(out.outputs[0].finish_reason == "length" and out.finished for out in outputs)


def test_metrics_stamp_arrival_first_token_and_finish_in_order(llm):
    (out,) = llm.generate([list(range(3, 30))], GREEDY, use_tqdm=False)
    m = out.metrics
    assert m.arrival_time == 0.0 == m.first_scheduled_time
    assert m.arrival_time < m.first_token_time < m.finished_time
    assert m.time_to_first_token == m.first_token_time
    assert m.num_preemptions == 0 and out.error is None


def test_a_stop_token_ends_the_request_with_reason_stop(llm):
    (first,) = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    token = first.outputs[0].token_ids[2]
    stop = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[token], ignore_eos=True)
    (out,) = llm.generate([[5, 6, 7]], stop, use_tqdm=False)
    completion = out.outputs[0]
    end = first.outputs[0].token_ids.index(token) + 1
    assert completion.token_ids == first.outputs[0].token_ids[:end]
    assert completion.finish_reason == "stop" and completion.stop_reason == token


def test_eos_stops_a_request_unless_ignore_eos():
    llm = LLM("tiny-llama", num_gpu_blocks_override=64, verbose=False)
    (free,) = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    token = free.outputs[0].token_ids[1]
    # declare the second greedy token the model's eos
    engine = llm.engine
    engine.model_config = dataclasses.replace(engine.model_config, eos_token_ids=(token,))
    (stopped,) = llm.generate(
        [[5, 6, 7]], dataclasses.replace(GREEDY, ignore_eos=False), use_tqdm=False
    )
    (ignored,) = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert stopped.outputs[0].token_ids == free.outputs[0].token_ids[:2]
    assert stopped.outputs[0].finish_reason == "stop"
    assert ignored.outputs[0].token_ids == free.outputs[0].token_ids


def test_same_seed_gives_the_same_samples_whatever_the_batch():
    sampling = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8)
    first = LLM("tiny-llama", num_gpu_blocks_override=64, seed=3, verbose=False)
    second = LLM("tiny-llama", num_gpu_blocks_override=64, seed=3, verbose=False)
    alone = first.generate([[9, 8, 7]], sampling, use_tqdm=False)[0].outputs[0].token_ids
    batch = second.generate([[9, 8, 7], list(range(50, 90))], sampling, use_tqdm=False)
    assert batch[0].outputs[0].token_ids == alone


def test_another_seed_gives_other_samples():
    sampling = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    outs = [
        LLM("tiny-llama", num_gpu_blocks_override=64, seed=seed, verbose=False)
        .generate([[9, 8, 7]], sampling, use_tqdm=False)[0]
        .outputs[0]
        .token_ids
        for seed in (0, 1)
    ]
    assert outs[0] != outs[1]


def test_string_prompts_are_tokenized_and_outputs_detokenized(hf_tiny_llama):
    llm = LLM(str(hf_tiny_llama), num_gpu_blocks_override=64, verbose=False)
    (out,) = llm.generate("the day was long", GREEDY, use_tqdm=False)
    assert out.prompt == "the day was long"
    assert out.prompt_token_ids == llm.tokenizer("the day was long")["input_ids"]
    expected = llm.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)
    assert out.outputs[0].text == expected


def test_a_string_prompt_without_a_tokenizer_is_refused(llm):
    with pytest.raises(KvlabError, match="no tokenizer"):
        llm.generate(["hello"], GREEDY, use_tqdm=False)


def test_token_prompt_forms_are_equivalent(llm):
    flat = llm.generate([5, 6, 7], GREEDY, use_tqdm=False)
    tokens_prompt = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)
    assert flat[0].outputs[0].token_ids == tokens_prompt[0].outputs[0].token_ids


def test_block_size_sets_the_page_size_of_a_spec_that_leaves_it_default():
    llm = LLM("tiny-llama", policy="paged:eviction=lru", block_size=4, num_gpu_blocks_override=8,
              verbose=False)
    assert llm.engine.page_size == 4 == llm.engine.kv_cache.page_size
    assert llm.engine.policy.eviction == "lru"


def test_a_block_size_contradicting_the_spec_is_refused():
    # one rule for the CLI and the API: the page size is given once
    with pytest.raises(KvlabError, match="block_size 4 contradicts policy 'paged:block_size=8'"):
        LLM("tiny-llama", policy="paged:block_size=8", block_size=4, num_gpu_blocks_override=8,
            verbose=False)


def test_prefix_caching_switch_turns_eviction_on():
    llm = LLM("tiny-llama", enable_prefix_caching=True, num_gpu_blocks_override=8, verbose=False)
    assert llm.engine.policy.eviction == "lru"


def test_startup_lines_are_printed_once(capsys):
    llm = LLM("tiny-llama", block_size=16, num_gpu_blocks_override=64, max_model_len=512)
    llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    err = capsys.readouterr().err
    assert err.count("CPU KV cache size: 1,024 tokens, Maximum concurrency for 512 tokens per "
                     "request: 2.00x") == 1


def test_every_page_comes_back_after_generate(llm):
    llm.generate(_prompts(), GREEDY, use_tqdm=False)
    usage = llm.engine.manager.usage()
    assert usage.num_used_pages == 0 and usage.num_live_token_slots == 0
