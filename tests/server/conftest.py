"""A live `kvlab serve` in this process: uvicorn on a free loopback port in a thread, over a
tiny random Llama with a word-level tokenizer and a chat template."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from engine_hf_models import save_hf_model, save_tokenizer, tiny_llama_config
from server_cases import API_KEY, CHAT_TEMPLATE, VOCAB_SIZE, engine_config

from tests.live_server import LiveServer, start_live_server


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory) -> Path:
    """A tiny random Llama folder with a word-level tokenizer and a chat template."""
    from transformers import AutoTokenizer

    # the vocabulary of the tokenizer (82 words and specials): every output id decodes
    folder = save_hf_model(tmp_path_factory.mktemp("serve_llama"),
                           tiny_llama_config(vocab_size=VOCAB_SIZE))
    save_tokenizer(folder, vocab_size=VOCAB_SIZE)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def live(chat_model) -> Iterator[LiveServer]:
    """A server over the chat model with an API key."""
    server = start_live_server(engine_config(chat_model), api_key=API_KEY)
    yield server
    server.stop()
