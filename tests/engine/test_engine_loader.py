"""Loading local Hugging Face folders: shards, dtypes, tokenizers, and the errors users meet."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from engine_hf_models import save_hf_model, tiny_llama_config
from safetensors.torch import load_file, save_file

from kvlab.engine.loader import load_model
from kvlab.engine.models.config import ModelConfig
from kvlab.errors import KvlabError


def _params(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def _copy(folder, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(folder, target)
    return target


def test_sharded_checkpoint_loads_the_same_weights_as_one_file(hf_tiny_llama, tmp_path):
    sharded = save_hf_model(tmp_path / "sharded", tiny_llama_config(), max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    whole, _, _ = load_model(hf_tiny_llama)
    parts, _, _ = load_model(sharded)
    for name, tensor in _params(whole).items():
        assert torch.equal(tensor, _params(parts)[name]), name


def test_dtype_override_converts_every_parameter(hf_tiny_llama):
    model, _, _ = load_model(hf_tiny_llama, dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_checkpoint_dtype_is_the_default(hf_tiny_llama, tmp_path):
    folder = _copy(hf_tiny_llama, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v.half() for k, v in tensors.items()}, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["dtype"] = "float16"
    (folder / "config.json").write_text(json.dumps(config))
    model, _, _ = load_model(folder)
    assert {p.dtype for p in model.parameters()} == {torch.float16}


def test_unsupported_dtype_is_refused_naming_the_choices(hf_tiny_llama):
    with pytest.raises(KvlabError, match="'int8' is not supported; expected float32"):
        load_model(hf_tiny_llama, dtype="int8")


def test_tokenizer_is_loaded_when_the_folder_has_one(hf_tiny_llama, hf_tiny_qwen2):
    _, _, tokenizer = load_model(hf_tiny_llama)
    assert tokenizer.encode("the cat of", add_special_tokens=False) == [3, 0, 5]
    assert load_model(hf_tiny_qwen2)[2] is None


def test_missing_config_json_is_named(hf_tiny_llama, tmp_path):
    folder = _copy(hf_tiny_llama, tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(KvlabError, match=r"config\.json: no such file"):
        load_model(folder)


def test_folder_without_safetensors_is_refused(hf_tiny_llama, tmp_path):
    folder = _copy(hf_tiny_llama, tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(KvlabError, match=r"no \*\.safetensors.*pytorch_model\.bin found"):
        load_model(folder)


def test_shard_listed_in_the_index_but_absent_is_named(tmp_path):
    folder = save_hf_model(tmp_path / "m", tiny_llama_config(), max_shard_size="40KB")
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(KvlabError, match=f"{shard.name}: no such file"):
        load_model(folder)


def test_missing_tensor_is_named(hf_tiny_llama, tmp_path):
    folder = _copy(hf_tiny_llama, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(KvlabError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' missing"):
        load_model(folder)


def test_tensor_of_the_wrong_shape_is_named(hf_tiny_llama, tmp_path):
    folder = _copy(hf_tiny_llama, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(KvlabError, match=r"'model.norm.weight' has shape \[65\], expected \[64\]"):
        load_model(folder)


def test_tensor_of_another_architecture_is_refused(hf_tiny_llama, tmp_path):
    folder = _copy(hf_tiny_llama, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(KvlabError, match=r"q_norm\.weight.*not part of a LlamaForCausalLM"):
        load_model(folder)


def test_unknown_name_is_neither_preset_nor_folder(tmp_path):
    with pytest.raises(KvlabError,
                       match="neither a preset \\(tiny-llama, tiny-qwen2, stdlib-llama\\)"):
        load_model(tmp_path / "nope")


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(KvlabError, match="LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"):
        load_model(tmp_path)


def test_bad_json_names_line_and_column(tmp_path):
    (tmp_path / "config.json").write_text('{\n  "vocab_size": 12,\n  oops\n}')
    with pytest.raises(KvlabError, match="line 3, column 3"):
        load_model(tmp_path)


def _raw_llama(**overrides):
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    raw.update(overrides)
    return raw


def test_transformers4_rope_fields_are_read():
    scaling = {"type": "linear", "factor": 4.0}
    config = ModelConfig.from_hf_dict(_raw_llama(rope_theta=5e5, rope_scaling=scaling))
    assert (config.rope_theta, config.rope_type) == (5e5, "linear")
    assert config.rope_parameter("factor") == 4.0


def test_unknown_rope_type_is_refused_naming_the_supported_ones():
    scaling = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(KvlabError, match="'yarn' is not supported; expected one of default"):
        ModelConfig.from_hf_dict(_raw_llama(rope_scaling=scaling))


def test_missing_kv_heads_means_multi_head_attention():
    config = ModelConfig.from_hf_dict(_raw_llama())
    assert config.num_key_value_heads == 4 and config.head_dim == 16


def test_sliding_window_no_longer_caps_the_model_length():
    raw = _raw_llama(
        architectures=["MistralForCausalLM"], max_position_embeddings=32768, sliding_window=4096
    )
    config = ModelConfig.from_hf_dict(raw)
    assert config.max_model_len == 32768 and config.layer_windows == (4096, 4096)


def test_qwen2_sliding_window_is_off_unless_used():
    raw = _raw_llama(
        architectures=["Qwen2ForCausalLM"], sliding_window=4096, use_sliding_window=False
    )
    config = ModelConfig.from_hf_dict(raw)
    assert config.max_model_len == 2048 and config.qkv_bias and not config.o_proj_bias
