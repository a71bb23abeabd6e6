"""Layer layouts read from config.json files the tests write: each family's fields, and bad or
contradictory configs named by file and field."""

from __future__ import annotations

import json

import pytest

from kvlab.errors import KvlabError
from kvlab.specs.hf import model_spec_from_hf

BASE = {"num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 8,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
        "torch_dtype": "bfloat16"}
S, F, C, L = "sliding_attention", "full_attention", "chunked_attention", "linear_attention"


def read(tmp_path, **fields):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **fields}))
    return model_spec_from_hf(tmp_path)


def test_a_plain_config_has_no_layout(tmp_path):
    spec = read(tmp_path)
    assert (spec.layer_types, spec.sliding_window, spec.linear_state_bytes) == ((), None, None)


def test_layer_types_and_sliding_window_are_read(tmp_path):
    spec = read(tmp_path, model_type="gpt_oss", layer_types=[S, F] * 4, sliding_window=128)
    assert spec.layer_types == (S, F) * 4 and spec.sliding_window == 128


def test_gpt_oss_alternates_without_layer_types(tmp_path):
    assert read(tmp_path, model_type="gpt_oss", sliding_window=128).layer_types == (S, F) * 4


def test_gemma3_sliding_window_pattern_makes_every_nth_layer_global(tmp_path):
    spec = read(tmp_path, model_type="gemma3_text", sliding_window=1024,
                sliding_window_pattern=4)
    assert spec.layer_types == (S, S, S, F) * 2
    default = read(tmp_path, model_type="gemma3_text", sliding_window=1024)
    assert default.layer_types == (S,) * 5 + (F,) + (S,) * 2


def test_qwen2_use_sliding_window_slides_from_max_window_layers(tmp_path):
    spec = read(tmp_path, use_sliding_window=True, sliding_window=4096, max_window_layers=6)
    assert spec.layer_types == (F,) * 6 + (S,) * 2
    assert read(tmp_path, use_sliding_window=False, sliding_window=4096).layer_types == ()


def test_mistral_bare_sliding_window_slides_every_layer(tmp_path):
    assert read(tmp_path, sliding_window=4096).layer_types == (S,) * 8


def test_llama4_no_rope_layers_are_global_and_the_rest_chunked(tmp_path):
    spec = read(tmp_path, model_type="llama4_text", attention_chunk_size=8192,
                no_rope_layers=[])
    assert spec.layer_types == (C, C, C, F) * 2 and spec.attention_chunk_size == 8192
    listed = read(tmp_path, attention_chunk_size=64, no_rope_layers=[1, 0] * 4)
    assert listed.layer_types == (C, F) * 4


def test_qwen3_next_full_attention_interval_and_gated_deltanet_state(tmp_path):
    spec = read(tmp_path, model_type="qwen3_next", full_attention_interval=4,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=16, linear_conv_kernel_dim=4)
    assert spec.layer_types == (L, L, L, F) * 2
    # conv (2*2*8 + 4*16) x 3 + recurrent 4 x 16 x 8, two bytes each
    assert spec.linear_state_bytes == ((32 + 64) * 3 + 4 * 16 * 8) * 2


def test_mamba2_state_from_its_fields(tmp_path):
    spec = read(tmp_path, layer_types=[L, F] * 4, mamba_num_heads=4, mamba_head_dim=8,
                n_groups=1, ssm_state_size=16, conv_kernel=4)
    assert spec.linear_state_bytes == ((32 + 2 * 16) * 3 + 4 * 8 * 16) * 2


def test_mla_and_deepseek_v32_sparse_fields(tmp_path):
    spec = read(tmp_path, kv_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16, index_topk=64,
                index_head_dim=128)
    assert (spec.kv_lora_rank, spec.qk_rope_head_dim, spec.head_dim) == (32, 8, 16)
    assert (spec.index_topk, spec.index_head_dim) == (64, 128)


@pytest.mark.parametrize(("fields", "message"), [
    ({"layer_types": [S, F]}, "layer_types is .* expected a list of 8 words"),
    ({"layer_types": ["local"] * 8}, "layer_types is"),
    ({"layer_types": [S] * 8}, "sliding_window is missing"),
    ({"layer_types": [F] * 8, "sliding_window_pattern": 2, "sliding_window": 8},
     "layer_types contradicts sliding_window_pattern"),
    ({"layer_types": [S] * 8, "use_sliding_window": False, "sliding_window": 8},
     "use_sliding_window is false"),
    ({"model_type": "gemma3_text", "sliding_window": 8, "sliding_window_pattern": 0},
     "sliding_window_pattern is 0"),
    ({"no_rope_layers": [1, 2, 3]}, "no_rope_layers is"),
    ({"full_attention_interval": 2}, "no state fields"),
    ({"index_topk": 2048}, "index_topk without kv_lora_rank"),
    ({"kv_lora_rank": 512}, "qk_rope_head_dim is missing"),
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 9},
     "max_window_layers is 9"),
])
def test_bad_configs_name_the_file_and_field(tmp_path, fields, message):
    with pytest.raises(KvlabError, match=r"config\.json: .*" + message):
        read(tmp_path, **fields)
