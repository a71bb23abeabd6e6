"""Which layers of a Hugging Face config slide, and over how many tokens, as transformers reads
it: Mistral's `sliding_window`, Qwen2's `use_sliding_window` + `max_window_layers`, and
`layer_types` lists (Qwen2, gpt-oss, Gemma 3)."""

from __future__ import annotations

import json

import pytest

from kvlab.engine.engine import _check_sliding_window
from kvlab.engine.models.config import ModelConfig, layer_windows
from kvlab.errors import KvlabError

SLIDING, FULL = "sliding_attention", "full_attention"


def _raw(architecture: str, num_layers: int = 4, **fields):
    raw = {
        "architectures": [architecture],
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
    }
    raw.update(fields)
    return raw


def test_mistral_slides_on_every_layer_and_ignores_layer_types():
    raw = _raw("MistralForCausalLM", sliding_window=16, layer_types=[FULL] * 4)
    assert ModelConfig.from_hf_dict(raw).layer_windows == (16,) * 4


def test_mistral_without_a_window_is_full_attention():
    config = ModelConfig.from_hf_dict(_raw("MistralForCausalLM", sliding_window=None))
    assert config.layer_windows == (0,) * 4 and not config.has_sliding_window


def test_llama_has_no_window_whatever_the_config_says():
    raw = _raw("LlamaForCausalLM", sliding_window=16, layer_types=[SLIDING] * 4)
    assert ModelConfig.from_hf_dict(raw).layer_windows == (0,) * 4


def test_qwen2_window_is_off_unless_use_sliding_window():
    for fields in ({}, {"use_sliding_window": False}):
        raw = _raw("Qwen2ForCausalLM", sliding_window=16, layer_types=[SLIDING] * 4, **fields)
        config = ModelConfig.from_hf_dict(raw)
        assert config.layer_windows == (0,) * 4 and config.sliding_window is None


def test_qwen2_layers_from_max_window_layers_on_slide():
    raw = _raw("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16, max_window_layers=1)
    assert ModelConfig.from_hf_dict(raw).layer_windows == (0, 16, 16, 16)


def test_qwen2_max_window_layers_defaults_to_28_as_in_transformers():
    raw = _raw("Qwen2ForCausalLM", 30, use_sliding_window=True, sliding_window=16)
    assert ModelConfig.from_hf_dict(raw).layer_windows == (0,) * 28 + (16, 16)


def test_qwen2_layer_types_take_precedence_over_max_window_layers():
    raw = _raw("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16,
               max_window_layers=0, layer_types=[SLIDING, FULL] * 2)
    assert ModelConfig.from_hf_dict(raw).layer_windows == (16, 0, 16, 0)


@pytest.mark.parametrize(
    ("architecture", "fields", "expected"),
    [
        # gpt-oss: alternating, sliding first, window 128
        ("GptOssForCausalLM", {"sliding_window": 128, "layer_types": [SLIDING, FULL] * 2},
         (128, 0, 128, 0)),
        # Gemma 3: five sliding layers to one full
        ("Gemma3ForCausalLM", {"sliding_window": 512, "layer_types": [SLIDING] * 5 + [FULL]},
         (512,) * 5 + (0,)),
        # a family without layer_types: the window on every layer
        ("SomeForCausalLM", {"sliding_window": 64}, (64,) * 6),
    ],
)
def test_interleaved_layer_types_give_each_layer_its_window(architecture, fields, expected):
    raw = _raw(architecture, len(expected), **fields)
    assert layer_windows(architecture, raw, len(expected)) == expected


def test_an_unknown_layer_type_names_config_json_and_the_field(tmp_path):
    raw = _raw("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16,
               layer_types=[SLIDING, FULL, "chunked_attention", FULL])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(KvlabError, match=r"config\.json: 'layer_types'\[2\] is 'chunked"):
        ModelConfig.from_json(path)


def test_layer_types_of_the_wrong_length_are_refused():
    raw = _raw("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16,
               layer_types=[SLIDING, FULL])
    with pytest.raises(KvlabError, match="expected a list of one type per layer"):
        ModelConfig.from_hf_dict(raw)


def test_a_window_that_is_not_a_whole_number_is_refused():
    with pytest.raises(KvlabError, match="'sliding_window' is 'wide'"):
        ModelConfig.from_hf_dict(_raw("MistralForCausalLM", sliding_window="wide"))


def test_interleaved_windows_round_trip_through_transformers():
    from transformers import AutoConfig

    raw = _raw("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=16,
               layer_types=[SLIDING, FULL] * 2)
    config = ModelConfig.from_hf_dict(raw)
    written = config.to_hf_dict()
    hf_config = AutoConfig.for_model(written.pop("model_type"), **written)
    assert ModelConfig.from_hf_dict(hf_config.to_dict()) == config


def test_a_backend_without_windows_is_refused_at_start_for_a_sliding_model():
    class FullOnly:
        supports_sliding_window = False

    _check_sliding_window(FullOnly(), (0, 0), "npu")  # a full-attention model runs
    with pytest.raises(KvlabError, match="attention_backend npu has no sliding-window"):
        _check_sliding_window(FullOnly(), (0, 8), "npu")
