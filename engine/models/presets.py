"""Model presets: tiny random-weight models built in memory, for demos and tests, and trained
models shipped in the package as Hugging Face folders (no downloads either way)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvlab.engine.models import stdlib_llama
from kvlab.engine.models.config import ModelConfig
from kvlab.engine.models.llama import LlamaForCausalLM

PRESET_SEED = 0
INIT_STD = 0.02  # transformers' initializer_range default for these families

MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny-llama": ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        torch_dtype="float32",
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "tiny-qwen2": ModelConfig(
        architecture="Qwen2ForCausalLM",
        vocab_size=1536,
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        qkv_bias=True,
        torch_dtype="float32",
        eos_token_ids=(0,),
    ),
}

# Trained models bundled as Hugging Face folders: the name loads the folder (weights, tokenizer,
# chat template) as a local folder would.
BUNDLED_MODELS: dict[str, Path] = {stdlib_llama.NAME: stdlib_llama.MODEL_DIR}


def build_preset(
    name: str,
    *,
    attn_backend: Any,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> LlamaForCausalLM:
    """The preset `name` with deterministic random weights (the same on every device and run)."""
    config = MODEL_PRESETS[name]
    dtype = dtype or getattr(torch, config.torch_dtype)
    model = LlamaForCausalLM(config, attn_backend=attn_backend, dtype=dtype, device=device)
    init_random_weights(model, seed=PRESET_SEED)
    return model


def init_random_weights(model: LlamaForCausalLM, *, seed: int) -> None:
    """Fill every parameter from a seeded CPU generator: norms 1, the rest N(0, INIT_STD)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
            continue
        values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * INIT_STD
        param.data.copy_(values)
