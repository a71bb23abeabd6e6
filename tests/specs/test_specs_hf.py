"""`--model FOLDER` in the simulator: a Hugging Face config.json read into a ModelSpec (no
torch), its parameter count from the safetensors headers, and clear errors on bad folders."""

from __future__ import annotations

import json
import struct

import pytest

from kvlab.errors import KvlabError
from kvlab.specs import get_model
from kvlab.specs.hf import model_spec_from_hf

LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3, "hidden_size": 64,
         "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 176,
         "vocab_size": 300, "max_position_embeddings": 512, "torch_dtype": "float16"}


def write_folder(folder, config, tensors=None):
    """config.json, and a safetensors file whose header lists `tensors` (name -> shape)."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        header = json.dumps({"__metadata__": {}, **{
            name: {"dtype": "F16", "shape": shape, "data_offsets": [0, 0]}
            for name, shape in tensors.items()}}).encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


def test_folder_reads_shape_dtype_and_length(tmp_path):
    spec = get_model(str(write_folder(tmp_path / "m", LLAMA)))
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads) == (3, 64, 8, 2)
    assert (spec.head_dim, spec.vocab_size, spec.max_model_len, spec.dtype_bytes) == (8, 300,
                                                                                      512, 2)
    # KV bytes per token: 2 (K and V) x layers x kv heads x head_dim x dtype bytes
    assert spec.kv_bytes_per_token() == 2 * 3 * 2 * 8 * 2


def test_parameter_count_comes_from_the_safetensors_headers(tmp_path):
    folder = write_folder(tmp_path / "m", LLAMA, {"a": [10, 20], "b": [7], "c": [2, 3, 4]})
    assert model_spec_from_hf(folder).num_params == 200 + 7 + 24


def test_without_weights_the_count_is_estimated_from_the_dimensions(tmp_path):
    spec = model_spec_from_hf(write_folder(tmp_path / "m", LLAMA))
    per_layer = 64 * (64 + 2 * 16) + 64 * 64 + 3 * 64 * 176 + 2 * 64
    assert spec.num_params == 3 * per_layer + 2 * 300 * 64 + 64


def test_config_json_path_and_nested_text_config_are_accepted(tmp_path):
    folder = write_folder(tmp_path / "m", {"architectures": ["X"], "text_config": LLAMA})
    assert model_spec_from_hf(folder / "config.json").num_layers == 3


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": 0}, "num_hidden_layers is 0, expected a positive integer"),
    ({"hidden_size": "64"}, "hidden_size is '64'"),
    ({"torch_dtype": "complex64"}, "dtype 'complex64' is not one of"),
])
def test_bad_fields_name_the_file_and_field(tmp_path, change, message):
    folder = write_folder(tmp_path / "m", {**LLAMA, **change})
    with pytest.raises(KvlabError, match="config.json: " + message.replace("(", r"\(")):
        get_model(str(folder))


def test_broken_files_are_named(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    with pytest.raises(KvlabError, match=r"config\.json: not a JSON model config"):
        get_model(str(folder))
    write_folder(folder, LLAMA)
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(KvlabError, match=r"model\.safetensors: not a safetensors file"):
        get_model(str(folder))


def test_a_folder_without_config_is_not_a_model(tmp_path):
    with pytest.raises(KvlabError,
                       match=r"a folder without config\.json .* or a Hugging Face model folder"):
        get_model(str(tmp_path))
