"""Train stdlib-llama: a byte-level BPE tokenizer and a small Llama on the stdlib corpus.

`python -m kvlab.engine.models.stdlib_llama.train DIR` (or `make text-model`, which writes the
committed folder) trains with TrainConfig's defaults on two torch threads and writes a Hugging
Face folder: config.json (LlamaForCausalLM), model.safetensors (bf16), tokenizer.json,
tokenizer_config.json (with a chat template), generation_config.json, and training.json (what
was trained on and how, and what came out).

Reproducible: the corpus (corpus.py, hash-checked), the tokenizer (BPE training is
deterministic; tokenizer.json's hash is recorded), the initial weights and the batch order
(seeded CPU generators). The loss curve and the weights are bit-for-bit the same on one machine
with the same torch build and thread count; another CPU (other SIMD kernels) or torch rounds
differently, so its weights differ in the last bits and its held-out perplexity by a little.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvlab.engine.models.stdlib_llama import MODEL_DIR, NAME
from kvlab.engine.models.stdlib_llama.corpus import (
    CHECKED_PYTHONS,
    Corpus,
    Segment,
    chat_pair,
    load_corpus,
)
from kvlab.errors import KvlabError

# Special tokens, ids 0-4. <|endoftext|> starts every document (the tokenizer adds it as BOS)
# and so also ends the one before; a chat turn ends with <|end|>. Both stop generation.
ENDOFTEXT, SYSTEM, USER, ASSISTANT, END = (
    "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
)
SPECIAL_TOKENS = (ENDOFTEXT, SYSTEM, USER, ASSISTANT, END)
ROLES = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
# <|endoftext|><|user|>\nWhat does json.dumps do?<|end|>\n<|assistant|>\n...<|end|>\n
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
TRAINING_RECORD = "training.json"


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """The tokenizer's, the model's and the optimizer's settings (the defaults are the
    committed model's)."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # vLLM's CPU fp8 KV cache wants a multiple of 32
    max_position_embeddings: int = 512  # what it was trained on: the engine's max_model_len
    tie_word_embeddings: bool = True
    seq_len: int = 512  # tokens a training sequence
    # Small batches, many steps: at this size and budget the loss fell with the step count more
    # than with the tokens a step (in trials, 4 x 256 tokens a step beat 8 x 256 and 8 x 512 at
    # equal tokens); 2 x 512 keeps that step with the whole context.
    batch_size: int = 2
    num_steps: int = 2000
    learning_rate: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    seed: int = 0
    num_threads: int = 2
    eval_tokens: int = 65536  # held-out tokens the perplexity is measured on (at most)

    def __post_init__(self) -> None:
        if self.seq_len > self.max_position_embeddings:
            raise KvlabError(f"seq_len {self.seq_len} is past max_position_embeddings "
                             f"{self.max_position_embeddings}")


def render_chat(messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """CHAT_TEMPLATE in Python (the training text of the chat documents; a test holds the two
    together)."""
    text = ENDOFTEXT + "".join(
        f"{ROLES[m['role']]}\n{m['content']}{END}\n" for m in messages
    )
    return text + (f"{ASSISTANT}\n" if add_generation_prompt else "")


def documents(segments: Sequence[Segment]) -> list[str]:
    """The documents of these segments, without their leading <|endoftext|>: each segment's
    source, then a chat exchange for each docstring that makes one."""
    code = [segment.text for segment in segments]
    chats = []
    for segment in segments:
        pair = chat_pair(segment)
        if pair is not None:
            messages = [{"role": "user", "content": pair[0]},
                        {"role": "assistant", "content": pair[1]}]
            chats.append(render_chat(messages).removeprefix(ENDOFTEXT))
    return code + chats


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer (tokenizers.Tokenizer) over `texts`, special tokens first and
    <|endoftext|> added in front of every encoded text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    # the special tokens are not text to learn merges from
    plain = [_strip_special(text) for text in texts]
    tokenizer.train_from_iterator(plain, trainer=trainer, length=len(plain))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{ENDOFTEXT} $A", pair=f"{ENDOFTEXT} $A {ENDOFTEXT} $B",
        special_tokens=[(ENDOFTEXT, 0)],
    )
    return tokenizer


def _strip_special(text: str) -> str:
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "\n")
    return text


def save_tokenizer(tokenizer: Any, folder: Path, max_length: int) -> None:
    """tokenizer.json and tokenizer_config.json (chat template included), in the names both
    transformers 4 and 5 read (transformers 5 writes its own class and special-token key)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT, END],
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    # in tokenizer_config.json, where every transformers version and vLLM look (not a .jinja)
    fast.save_pretrained(folder, save_jinja_files=False)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["additional_special_tokens"] = [SYSTEM, USER, ASSISTANT, END]
    config.pop("extra_special_tokens", None)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def token_stream(tokenizer: Any, texts: Sequence[str]) -> torch.Tensor:
    """Every text encoded with its leading <|endoftext|>, one after another (int64)."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids += encoding.ids
    return torch.tensor(ids, dtype=torch.int64)


def shuffled(texts: Sequence[str], seed: int) -> list[str]:
    """`texts` in a seeded order (so code and chat documents interleave)."""
    generator = torch.Generator().manual_seed(seed)
    return [texts[i] for i in torch.randperm(len(texts), generator=generator).tolist()]


def build_model(config: TrainConfig, eos_ids: Sequence[int]) -> Any:
    """A transformers LlamaForCausalLM of `config`, initialized from config.seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=0,
        eos_token_id=list(eos_ids),
        pad_token_id=0,
    )
    torch.manual_seed(config.seed)
    return LlamaForCausalLM(hf_config).float()


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.num_steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(model: Any, stream: torch.Tensor, config: TrainConfig,
                log_every: int = 0) -> list[float]:
    """Train on random windows of `stream`; the loss of every step."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate, betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(config.seed + 1)
    num_starts = len(stream) - config.seq_len - 1
    if num_starts < 1:
        raise KvlabError(f"{len(stream)} training tokens: fewer than seq_len {config.seq_len}")
    columns = torch.arange(config.seq_len + 1)
    losses = []
    model.train()
    for step in range(config.num_steps):
        starts = torch.randint(0, num_starts, (config.batch_size, 1), generator=generator)
        window = stream[starts + columns]
        logits = model(input_ids=window[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        optimizer.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == config.num_steps - 1):
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {learning_rate(config, step):.2e}",
                  flush=True)
    model.eval()
    return losses


@torch.no_grad()
def perplexity(model: Any, stream: torch.Tensor, seq_len: int, max_tokens: int) -> float:
    """exp(mean next-token loss) over consecutive windows of seq_len tokens of `stream` (the
    first max_tokens predicted tokens at most)."""
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, seq_len):
        if count >= max_tokens:
            break
        window = stream[start:start + seq_len + 1].unsqueeze(0)
        if window.shape[1] < 2:
            break
        logits = model(input_ids=window[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), window[0, 1:], reduction="sum"
        )
        total += loss.item()
        count += window.shape[1] - 1
    return math.exp(total / count)


def train(folder: Path, config: TrainConfig | None = None, *, corpus: Corpus | None = None,
          log_every: int = 50) -> dict[str, Any]:
    """Train the tokenizer and the model, write the Hugging Face folder; the training record."""
    config = config or TrainConfig()
    corpus = corpus or load_corpus()
    if not corpus.segments:
        raise KvlabError("the stdlib corpus is empty: this Python's stdlib has none of its text")
    num_threads = torch.get_num_threads()
    torch.set_num_threads(config.num_threads)
    try:
        return _train(folder, config, corpus, log_every)
    finally:
        torch.set_num_threads(num_threads)


def _train(folder: Path, config: TrainConfig, corpus: Corpus, log_every: int) -> dict[str, Any]:
    train_texts = shuffled(documents(corpus.split(held_out=False)), config.seed)
    held_out_texts = shuffled(documents(corpus.split(held_out=True)), config.seed)
    tokenizer = train_tokenizer(train_texts, config.vocab_size)
    if tokenizer.get_vocab_size() != config.vocab_size:
        raise KvlabError(
            f"the corpus makes {tokenizer.get_vocab_size()} tokens, fewer than vocab_size "
            f"{config.vocab_size}"
        )
    train_stream = token_stream(tokenizer, train_texts)
    held_out_stream = token_stream(tokenizer, held_out_texts)
    eos_ids = [tokenizer.token_to_id(ENDOFTEXT), tokenizer.token_to_id(END)]
    model = build_model(config, eos_ids)
    started = time.perf_counter()
    losses = train_model(model, train_stream, config, log_every=log_every)
    training_s = time.perf_counter() - started
    fp32_ppl = perplexity(model, held_out_stream, config.seq_len, config.eval_tokens)
    model.to(torch.bfloat16).float()  # the saved bf16 weights, computed in fp32
    held_out_ppl = perplexity(model, held_out_stream, config.seq_len, config.eval_tokens)
    folder.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    model.generation_config.save_pretrained(folder)
    save_tokenizer(tokenizer, folder, config.max_position_embeddings)
    record = {
        "name": NAME,
        "command": f"python -m kvlab.engine.models.stdlib_llama.train {folder}",
        "corpus": {
            "source": "CPython stdlib top-level definitions identical in "
                      + ", ".join(CHECKED_PYTHONS) + " (corpus_manifest.tsv)",
            "sha256": corpus.sha256,
            "num_segments": len(corpus.segments),
            "num_missing_segments": corpus.num_missing,
            "num_train_tokens": len(train_stream),
            "num_held_out_tokens": len(held_out_stream),
            "train_tokens_sha256": _tensor_sha256(train_stream),
        },
        "config": dataclasses.asdict(config),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": round(losses[-1], 6),
        "held_out_perplexity": round(held_out_ppl, 3),
        "held_out_perplexity_fp32_weights": round(fp32_ppl, 3),
        "held_out_tokens_measured": min(config.eval_tokens, len(held_out_stream) - 1),
        "uniform_perplexity": config.vocab_size,
        "training_s": round(training_s, 1),
        "tokenizer_sha256": _sha256((folder / "tokenizer.json").read_bytes()),
        "weights_sha256": _sha256((folder / "model.safetensors").read_bytes()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    (folder / TRAINING_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tensor_sha256(ids: torch.Tensor) -> str:
    return _sha256(ids.numpy().astype("<i4").tobytes())


def main(argv: list[str] | None = None) -> int:
    """Train with the defaults into DIR and print the held-out perplexity."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=MODEL_DIR, metavar="DIR",
                        help=f"where to write the model (default: the committed {MODEL_DIR})")
    defaults = TrainConfig()
    parser.add_argument("--num-steps", type=int, default=defaults.num_steps,
                        help=f"optimizer steps (default {defaults.num_steps})")
    args = parser.parse_args(argv)
    config = dataclasses.replace(defaults, num_steps=args.num_steps)
    corpus = load_corpus()
    if corpus.num_missing:
        print(f"warning: {corpus.num_missing} corpus segments differ on Python "
              f"{platform.python_version()}; the corpus is not the committed one",
              file=sys.stderr)
    record = train(args.folder, config, corpus=corpus)
    print(f"held-out perplexity {record['held_out_perplexity']:.2f} "
          f"(uniform {record['uniform_perplexity']}) on {record['held_out_tokens_measured']} "
          f"tokens; trained {config.num_steps} steps in {record['training_s']:.0f} s; "
          f"wrote {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
