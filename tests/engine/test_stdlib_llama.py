"""stdlib-llama: the bundled trained model loads by name, its tokenizer and chat template work,
it predicts held-out stdlib text far better than chance, kvlab's engine generates what
transformers does, and its training script is deterministic."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from engine_hf_models import transformers_greedy

from kvlab.engine import LLM, SamplingParams
from kvlab.engine.loader import load_model
from kvlab.engine.models.stdlib_llama import MODEL_DIR, NAME
from kvlab.engine.models.stdlib_llama.corpus import Corpus, load_corpus
from kvlab.engine.models.stdlib_llama.train import (
    ASSISTANT,
    END,
    ENDOFTEXT,
    USER,
    TrainConfig,
    documents,
    perplexity,
    render_chat,
    token_stream,
    train,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CODE = 'def greet(name):\n    """Say hello."""\n    return f"hello, {name}!"\n'
MESSAGES = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What does json.dumps do?"}]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_DIR), local_files_only=True)


def test_the_preset_name_loads_the_bundled_trained_model():
    model, config, tokenizer = load_model(NAME)
    assert config.architecture == "LlamaForCausalLM"
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tokenizer is not None and len(tokenizer) == config.vocab_size
    assert config.eos_token_ids == tuple(tokenizer.convert_tokens_to_ids([ENDOFTEXT, END]))


def test_the_weights_stay_small():
    assert (MODEL_DIR / "model.safetensors").stat().st_size < 10 * 2**20


def test_the_tokenizer_round_trips_text_and_adds_a_bos(tokenizer):
    ids = tokenizer(CODE)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    assert tokenizer.decode(ids, skip_special_tokens=True) == CODE


def test_the_chat_template_renders_the_training_format(tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == render_chat(MESSAGES, add_generation_prompt=True)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    specials = tokenizer.convert_tokens_to_ids([ENDOFTEXT, USER, END, ASSISTANT])
    assert ids[0] == specials[0] and ids.count(specials[0]) == 1  # one BOS, from the template
    assert set(specials) <= set(ids) and ids[-2] == specials[3]  # ends "<|assistant|>\n"


def test_held_out_perplexity_is_far_under_uniform(tokenizer, corpus):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.float32).eval()
    texts = documents(corpus.split(held_out=True)[:40])
    stream = torch.tensor([i for text in texts for i in tokenizer(text)["input_ids"]])
    value = perplexity(model, stream, seq_len=256, max_tokens=1024)
    record = json.loads((MODEL_DIR / "training.json").read_text(encoding="utf-8"))
    assert value < len(tokenizer) / 20
    assert record["held_out_perplexity"] < record["uniform_perplexity"] / 20


def test_engine_greedy_equals_transformers_on_text_and_chat(tokenizer):
    prompts = [
        tokenizer("def ")["input_ids"],
        tokenizer(CODE + "\n\nclass ")["input_ids"],
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                      return_dict=False),
    ]
    max_tokens = [24, 24, 24]
    expected = transformers_greedy(MODEL_DIR, prompts, max_tokens)
    llm = LLM(NAME, dtype="float32", verbose=False, kv_cache_memory="64MiB")
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [out.outputs[0].token_ids for out in outputs] == expected


def test_text_prompts_continue_as_python():
    llm = LLM(NAME, verbose=False, kv_cache_memory="64MiB")
    params = SamplingParams(temperature=0.0, max_tokens=32)
    text = llm.generate("def ", params, use_tqdm=False)[0].outputs[0].text
    assert "(" in text and ":" in text


TINY = TrainConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                   max_position_embeddings=64, seq_len=32, batch_size=2, num_steps=4,
                   warmup_steps=2, num_threads=1, eval_tokens=256)


def test_training_is_deterministic_and_writes_a_loadable_folder(tmp_path, corpus):
    small = Corpus(corpus.split(held_out=False)[:30] + corpus.split(held_out=True)[:5], 0)
    first = train(tmp_path / "a", TINY, corpus=small, log_every=0)
    second = train(tmp_path / "b", TINY, corpus=small, log_every=0)
    for key in ("final_loss", "held_out_perplexity", "tokenizer_sha256", "weights_sha256"):
        assert first[key] == second[key], key
    assert first["corpus"]["sha256"] == small.sha256
    _, config, tokenizer = load_model(tmp_path / "a")
    assert config.vocab_size == TINY.vocab_size and tokenizer.chat_template
    assert dataclasses.asdict(TINY) == first["config"]


def test_training_documents_are_token_streams_with_a_bos_each(corpus):
    texts = documents(corpus.split(held_out=True)[:3])
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    stream = token_stream(tokenizer, texts)
    assert int((stream == tokenizer.token_to_id(ENDOFTEXT)).sum()) == len(texts)
