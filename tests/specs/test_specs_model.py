"""ModelSpec arithmetic and the model presets' consistency."""

import re

import pytest

from kvlab.errors import KvlabError
from kvlab.specs import get_model, list_hardware, list_models
from kvlab.specs.loading import model_problem

KiB = 1024


@pytest.mark.parametrize(
    ("name", "kib_per_token"),
    [
        ("llama-2-7b", 512),  # FACTS.md: Llama-2-7B fp16
        ("llama-3.1-8b", 128),  # FACTS.md: Llama-3-8B
        ("llama-2-70b", 320),  # FACTS.md: Llama-2/3-70B
        ("llama-3.1-70b", 320),
    ],
)
def test_kv_bytes_per_token_match_published_figures(name, kib_per_token):
    assert get_model(name).kv_bytes_per_token() == kib_per_token * KiB


def test_mla_caches_one_latent_per_layer():
    deepseek = get_model("deepseek-v3")
    assert deepseek.kv_bytes_per_token() == (512 + 64) * 2 * 61


def test_mla_latent_is_not_split_by_tensor_parallelism():
    deepseek = get_model("deepseek-v3")
    assert deepseek.kv_bytes_per_token(8) == deepseek.kv_bytes_per_token(1)


def test_tensor_parallelism_splits_kv_heads():
    llama = get_model("llama-2-70b")  # 8 KV heads
    assert llama.kv_bytes_per_token(4) == llama.kv_bytes_per_token(1) // 4


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    qwen = get_model("qwen2.5-7b")  # 4 KV heads: at tp 8 each device still holds one
    assert qwen.kv_bytes_per_token(8) == qwen.kv_bytes_per_token(4)


def test_uneven_kv_head_split_rounds_up():
    qwen = get_model("qwen2.5-7b")  # 4 KV heads over 3 devices: 2 on each
    assert qwen.kv_bytes_per_token(3) == qwen.kv_bytes_per_token(2)


def test_tensor_parallelism_splits_weights():
    llama = get_model("llama-2-7b")
    assert llama.weight_bytes(2) == llama.weight_bytes(1) // 2


def test_weights_take_two_bytes_per_parameter_by_default():
    llama = get_model("llama-2-7b")
    assert llama.weight_bytes() == 2 * 6_738_415_616


def test_fp8_weights_take_one_byte_per_parameter():
    assert get_model("deepseek-v3").weight_bytes() == 671_000_000_000


def test_tensor_parallel_size_below_one_is_a_user_error():
    with pytest.raises(KvlabError, match="tensor_parallel_size"):
        get_model("llama-2-7b").kv_bytes_per_token(0)


def test_moe_presets_compute_with_fewer_parameters_than_they_hold():
    mixtral = get_model("mixtral-8x7b")
    assert mixtral.is_moe
    assert (round(mixtral.num_params / 1e9, 1), round(mixtral.num_active_params / 1e9, 1)) == (
        46.7,
        12.9,
    )


def _dense_param_count(spec, qkv_bias: bool) -> int:
    """Parameters of a Llama-style decoder with untied embeddings, from its dimensions."""
    h, kv_width = spec.hidden_size, spec.num_kv_heads * spec.head_dim
    attention = 2 * h * spec.num_heads * spec.head_dim + 2 * h * kv_width
    if qkv_bias:
        attention += spec.num_heads * spec.head_dim + 2 * kv_width
    layer = attention + 3 * h * spec.intermediate_size + 2 * h
    return spec.num_layers * layer + h + 2 * spec.vocab_size * h


@pytest.mark.parametrize(
    "name",
    ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "internlm2-20b"],
)
def test_dense_parameter_counts_follow_from_dimensions(name):
    spec = get_model(name)
    assert spec.num_params == spec.num_active_params == _dense_param_count(spec, qkv_bias=False)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen2.5-72b"])
def test_qwen_parameter_counts_include_qkv_bias(name):
    spec = get_model(name)
    assert spec.num_params == _dense_param_count(spec, qkv_bias=True)


@pytest.mark.parametrize("spec", list(list_models().values()), ids=lambda spec: spec.name)
def test_model_presets_are_consistent(spec):
    assert model_problem(spec) is None


def test_preset_names_are_lowercase_and_dashed():
    names = [*list_models(), *list_hardware()]
    assert all(re.fullmatch(r"[a-z0-9.]+(-[a-z0-9.]+)*", name) for name in names)
