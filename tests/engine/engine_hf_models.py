"""Builders of tiny random Hugging Face checkpoints (saved by transformers) for engine tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come"
)


def save_tokenizer(folder: Path, vocab_size: int) -> None:
    """A whitespace word-level tokenizer over WORDS (ids 3..), with <unk>, <s>, </s> as 0, 1, 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for word in WORDS.split():
        vocab.setdefault(word, len(vocab))
    assert len(vocab) <= vocab_size
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(folder)


def save_hf_model(
    folder: Path, config, *, seed: int = 0, drop_fields: tuple[str, ...] = (), **save_kwargs
) -> Path:
    """Build a random transformers model of `config` (fp32) and save it as safetensors;
    `drop_fields` are removed from the saved config.json (fields older checkpoints lack)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # transformers starts biases at 0 and norms at 1: perturb them so tests see them used
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, config.initializer_range)
            elif name.endswith("norm.weight"):
                param.normal_(1.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    if drop_fields:
        path = folder / "config.json"
        raw = json.loads(path.read_text(encoding="utf-8"))
        for name in drop_fields:
            raw.pop(name)
        path.write_text(json.dumps(raw, indent=2), encoding="utf-8")
    return folder


# Weights ten times transformers' default spread: logits then react to any wrong detail (a
# missing bias, a wrong rope frequency) far above the fp32 tolerance of the equivalence tests.


def tiny_llama_config(**overrides):
    """A 2-layer Llama with GQA and Llama 3.1 rope scaling."""
    from transformers import LlamaConfig

    fields = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def tiny_qwen2_config(**overrides):
    """A 2-layer Qwen2 with q/k/v biases and tied embeddings."""
    from transformers import Qwen2Config

    fields = dict(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        eos_token_id=0,
        initializer_range=0.2,
    )
    fields.update(overrides)
    return Qwen2Config(**fields)


def transformers_greedy(
    folder: Path, prompts: list[list[int]], max_tokens: list[int]
) -> list[list[int]]:
    """Reference outputs: transformers' greedy `generate` of each prompt, with no EOS stop (as
    `ignore_eos`: always its max_tokens tokens)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt, num_tokens in zip(prompts, max_tokens, strict=True):
        ids = torch.tensor([prompt])
        generated = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_tokens,
            pad_token_id=0,
        )
        outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def tiny_mistral_config(**overrides):
    """A 2-layer Mistral with GQA and a sliding window of 8 tokens on every layer."""
    from transformers import MistralConfig

    fields = dict(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=8,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    fields.update(overrides)
    return MistralConfig(**fields)
