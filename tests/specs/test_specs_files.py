"""User model and hardware files (YAML, JSON) and preset look-up."""

import dataclasses
import json

import pytest

from kvlab.errors import KvlabError
from kvlab.specs import HardwareSpec, ModelSpec, get_hardware, get_model

MODEL_YAML = """\
name: my-llama
num_layers: 2
hidden_size: 64
num_heads: 4
num_kv_heads: 2
head_dim: 16
intermediate_size: 128
vocab_size: 1000
max_model_len: 512
num_params: 1.2e+6
num_active_params: 1.2e+6
"""

HARDWARE_JSON = {
    "name": "my-npu",
    "hbm_bytes": 32_000_000_000,
    "hbm_bandwidth": 1e12,
    "peak_flops": 2e14,
    "host_link_bandwidth": 25e9,
    "host_link_latency_s": 1e-5,
    "num_devices": 4,
    "step_overhead_s": 0.0,
}


def test_model_yaml_file_loads(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(MODEL_YAML)
    spec = get_model(str(path))
    assert (spec.name, spec.num_kv_heads, spec.dtype_bytes) == ("my-llama", 2, 2)


def test_hardware_json_file_loads(tmp_path):
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(HARDWARE_JSON))
    assert get_hardware(str(path)) == HardwareSpec(**HARDWARE_JSON)


def test_yaml_numbers_without_a_dot_are_accepted(tmp_path):
    # PyYAML reads 1e12 as the string "1e12"; a user should not have to know that.
    path = tmp_path / "npu.yaml"
    path.write_text(
        "hbm_bytes: 32e9\nhbm_bandwidth: 1e12\npeak_flops: 2e14\nhost_link_bandwidth: 25e9\n"
        "host_link_latency_s: 1e-5\nnum_devices: 4\nstep_overhead_s: 0\n"
    )
    spec = get_hardware(str(path))
    assert (spec.hbm_bytes, spec.hbm_bandwidth, spec.host_link_latency_s) == (32e9, 1e12, 1e-5)


def test_file_without_name_is_named_after_itself(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(MODEL_YAML.replace("name: my-llama\n", ""))
    assert get_model(str(path)).name == "tiny"


def test_preset_json_block_round_trips_as_a_user_file(tmp_path):
    preset = get_model("deepseek-v3")
    path = tmp_path / "deepseek.json"
    path.write_text(json.dumps(dataclasses.asdict(preset)))
    assert get_model(str(path)) == preset


def test_unknown_field_names_the_file_field_and_valid_fields(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(MODEL_YAML + "num_experts: 8\n")
    with pytest.raises(KvlabError) as err:
        get_model(str(path))
    message = str(err.value)
    assert "model.yaml" in message and "'num_experts'" in message and "kv_lora_rank" in message


def test_missing_field_names_the_file_and_field(tmp_path):
    path = tmp_path / "npu.json"
    path.write_text(json.dumps({k: v for k, v in HARDWARE_JSON.items() if k != "peak_flops"}))
    with pytest.raises(KvlabError, match=r"npu\.json: missing field 'peak_flops'"):
        get_hardware(str(path))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("num_layers: two", "expected a number"),
        ("num_layers: 2.5", "expected a whole number"),
        ("num_layers: 0", "expected a positive number"),
        ("num_layers: true", "expected a number"),
    ],
)
def test_bad_field_values_are_user_errors(tmp_path, line, expected):
    path = tmp_path / "model.yaml"
    path.write_text(MODEL_YAML.replace("num_layers: 2", line))
    with pytest.raises(KvlabError, match=f"'num_layers'.*{expected}"):
        get_model(str(path))


def test_inconsistent_heads_are_a_user_error(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(MODEL_YAML.replace("num_kv_heads: 2", "num_kv_heads: 3"))
    with pytest.raises(KvlabError, match="not a multiple of num_kv_heads"):
        get_model(str(path))


def test_half_an_mla_description_is_a_user_error(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(MODEL_YAML + "kv_lora_rank: 64\n")
    with pytest.raises(KvlabError, match="give both or neither"):
        get_model(str(path))


def test_invalid_yaml_is_a_user_error(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("num_layers: [2\n")
    with pytest.raises(KvlabError, match="not valid YAML"):
        get_model(str(path))


def test_a_list_instead_of_a_mapping_is_a_user_error(tmp_path):
    path = tmp_path / "model.json"
    path.write_text("[1, 2]")
    with pytest.raises(KvlabError, match="expected a mapping"):
        get_model(str(path))


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(KvlabError, match="cannot read model file"):
        get_model(str(tmp_path / "absent.yaml"))


def test_unknown_model_preset_lists_the_valid_names():
    with pytest.raises(
        KvlabError, match=r"unknown model preset 'llama-9b'.*llama-2-7b.*deepseek-v3"
    ):
        get_model("llama-9b")


def test_unknown_hardware_preset_lists_the_valid_names():
    with pytest.raises(KvlabError, match=r"unknown hardware preset 'tpu'.*ascend-910b.*cpu"):
        get_hardware("tpu")


def test_presets_are_returned_by_name():
    assert isinstance(get_model("llama-2-7b"), ModelSpec)
    assert get_hardware("atlas-800t-a2").num_devices == 8


def test_preset_names_match_in_any_case():
    assert get_model("Llama-2-7B") is get_model("llama-2-7b")


def test_a_yaml_syntax_error_is_one_line_with_its_position(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nnum_layers: [1,\n  2\nhidden: : :\n")
    with pytest.raises(KvlabError) as caught:
        get_model(str(path))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path} line 4, column 7: not valid YAML (")
