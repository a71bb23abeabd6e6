"""Bad input to the engine: clear errors that name what to fix, and no crash on memory pressure."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.engine import LLM, SamplingParams
from kvlab.errors import KvlabError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _llm(**kwargs) -> LLM:
    return LLM("tiny-llama", verbose=False, **{"num_gpu_blocks_override": 32, **kwargs})


def test_a_prompt_longer_than_max_model_len_fails_alone():
    llm = _llm(max_model_len=32)
    outputs = llm.generate([[5] * 10, [6] * 40, [7] * 20], GREEDY, use_tqdm=False)
    assert [len(out.outputs[0].token_ids) for out in outputs] == [4, 0, 4]
    failed = outputs[1]
    assert failed.outputs[0].finish_reason == "error" and failed.finished
    assert "40 prompt" in failed.error and "max_model_len 32" in failed.error
    assert outputs[0].error is None and outputs[2].error is None


def test_a_request_larger_than_the_whole_cache_fails_alone():
    llm = _llm(block_size=4, num_gpu_blocks_override=4)  # 16 token slots in all
    outputs = llm.generate([[5] * 6, [6] * 30], GREEDY, use_tqdm=False)
    assert outputs[0].error is None
    assert "KV pages" in outputs[1].error


def test_a_model_folder_without_config_names_the_file(hf_tiny_qwen2, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(hf_tiny_qwen2, folder)
    (folder / "config.json").unlink()
    with pytest.raises(KvlabError, match=r"config\.json"):
        LLM(str(folder), num_gpu_blocks_override=8, verbose=False)


def test_a_model_folder_without_weights_names_what_is_missing(hf_tiny_qwen2, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(hf_tiny_qwen2, folder)
    for file in folder.glob("*.safetensors"):
        file.unlink()
    with pytest.raises(KvlabError, match=r"\*\.safetensors"):
        LLM(str(folder), num_gpu_blocks_override=8, verbose=False)


def test_an_unknown_device_lists_the_valid_ones():
    with pytest.raises(KvlabError, match="cpu, cuda, npu"):
        _llm(device="tpu")


def test_an_unknown_attention_backend_lists_the_valid_ones():
    with pytest.raises(KvlabError, match="torch") as error:
        _llm(attention_backend="flash")
    assert "'flash'" in str(error.value)


def test_an_unknown_policy_lists_the_valid_kinds():
    with pytest.raises(KvlabError, match="buddy, contiguous, paged"):
        _llm(policy="slab")


def test_max_model_len_beyond_the_model_is_refused():
    with pytest.raises(KvlabError, match="max_model_len is 9999; expected 1 to"):
        _llm(max_model_len=9999)


def test_a_token_id_outside_the_vocabulary_is_refused():
    llm = _llm()
    with pytest.raises(KvlabError, match="token id 5000 is outside"):
        llm.generate([[1, 5000]], GREEDY, use_tqdm=False)


def test_an_empty_prompt_is_refused():
    with pytest.raises(KvlabError, match="empty"):
        _llm().generate([[]], GREEDY, use_tqdm=False)


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([[1, 2.5]], "prompt 0: token ids must be whole numbers"),
        ([[1, 2], [3, True]], "prompt 1: token ids must be whole numbers"),
        ([1, [2, 3]], "mixes token ids with other prompts"),
    ],
)
def test_bad_token_prompts_are_refused(prompts, message):
    with pytest.raises(KvlabError, match=message):
        _llm().generate(prompts, GREEDY, use_tqdm=False)


def test_sampling_params_must_match_the_prompts():
    with pytest.raises(KvlabError, match="2 SamplingParams for 3 prompts"):
        _llm().generate([[1], [2], [3]], [GREEDY, GREEDY], use_tqdm=False)


def test_a_bad_memory_size_names_the_argument():
    with pytest.raises(KvlabError, match="kv_cache_memory '12 parsecs'"):
        _llm(num_gpu_blocks_override=None, kv_cache_memory="12 parsecs")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    max_tokens=st.integers(1, 8),
    num_pages=st.integers(16, 24),
    policy=st.sampled_from(
        [
            "paged:block_size=4",
            "paged:block_size=4,preemption=swap,host_pages=4",
            "paged:block_size=4,eviction=lru,victim=longest",
            "buddy:block_size=4,block_sizing=geometric",
        ]
    ),
)
def test_memory_pressure_never_crashes_and_every_request_finishes(
    lengths, max_tokens, num_pages, policy
):
    llm = LLM("tiny-llama", policy=policy, num_gpu_blocks_override=num_pages, verbose=False)
    prompts = [[3 + i] * n for i, n in enumerate(lengths)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(out.outputs[0].token_ids) == max_tokens for out in outputs)
    usage = llm.engine.manager.usage()
    assert usage.num_used_pages == 0 and usage.num_host_used_pages == 0
