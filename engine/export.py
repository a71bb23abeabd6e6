"""Write a model as a Hugging Face folder (config.json, model.safetensors, a tokenizer) that
vLLM, transformers and kvlab all load: a tiny preset becomes a real checkpoint a peer server
can serve with exactly the weights `kvlab serve PRESET` runs."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from kvlab.engine.models.llama import LlamaForCausalLM
from kvlab.engine.models.presets import MODEL_PRESETS, build_preset
from kvlab.errors import KvlabError

# Word tokens of the generated vocabulary: `t<id>` for every id past the special ones, so that
# every token id decodes to a distinct word and re-encodes to the same id.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# The exported tokenizer's chat template: the messages' contents after <s>, one after another
# (roles are words the vocabulary lacks), so that /v1/chat/completions serves the folder.
WORD_CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['content'] }} "
                      "{% endfor %}")


def export_preset(name: str, folder: str | Path, *, overwrite: bool = False) -> Path:
    """Save preset `name` (its deterministic random weights) as a Hugging Face folder."""
    if name not in MODEL_PRESETS:
        raise KvlabError(
            f"model {name!r} is not a preset; choose from {', '.join(MODEL_PRESETS)}",
            parameters=("model",),
        )
    path = Path(folder)
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise KvlabError(
            f"{path}: folder exists and is not empty; choose another, or overwrite it",
            parameters=("output", "overwrite"),
        )
    path.mkdir(parents=True, exist_ok=True)
    model = build_preset(name, attn_backend="torch")
    save_model(model, path)
    save_word_tokenizer(path, model.config.vocab_size)
    return path


def save_model(model: LlamaForCausalLM, folder: Path) -> None:
    """config.json and model.safetensors, with Hugging Face names (fused weights split)."""
    config = model.config.to_hf_dict()
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    # clone: a fused parameter's row views share storage, which safetensors refuses
    tensors = {name: view.clone() for name, view in model.hf_state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def save_word_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer over the whole vocabulary: <unk>, <s>, </s> as 0, 1, 2, then a
    word `t<id>` per id; text is split on whitespace. Every id decodes and re-encodes. Its
    chat template is WORD_CHAT_TEMPLATE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= len(SPECIAL_TOKENS):
        raise KvlabError(f"vocab_size {vocab_size}: too small for a tokenizer")
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"t{index}": index for index in range(len(SPECIAL_TOKENS), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Tokens join with a space (WordPiece's decoder without a continuation prefix).
    tokenizer.decoder = decoders.WordPiece(prefix="\0", cleanup=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = WORD_CHAT_TEMPLATE
    fast.save_pretrained(folder)
