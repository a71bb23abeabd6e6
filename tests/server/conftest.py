"""A live `kvlab serve` in this process: uvicorn on a free loopback port in a thread, over a
tiny random Llama with a word-level tokenizer and a chat template."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from engine_hf_models import save_hf_model, save_tokenizer, tiny_llama_config

from kvlab.engine.config import EngineConfig
from kvlab.policies.serving import ServingConfig
from kvlab.server import EngineService, ServeConfig, build_app, start_service

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
API_KEY = "test-key"
VOCAB_SIZE = 82


@dataclass
class LiveServer:
    """A running server: its URL, its service (engine thread) and uvicorn."""

    base_url: str
    service: EngineService
    server: uvicorn.Server
    thread: threading.Thread
    model_name: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.service.stop(5.0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_live_server(engine: EngineConfig, *, api_key: str | None = None,
                      max_queue: int = 1024) -> LiveServer:
    """Serve `engine` on a free port; returns once uvicorn accepts connections."""
    service, name = start_service(ServeConfig(engine=engine, max_queue=max_queue))
    app = build_app(service, model_name=name, api_key=api_key)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    return LiveServer(f"http://127.0.0.1:{port}", service, server, thread, name)


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


def engine_config(model: Path | str, policy: str = "paged:block_size=4,eviction=lru",
                  num_pages: int = 64, **serving: object) -> EngineConfig:
    """A small engine: `num_pages` pages of 4 tokens, so that requests compete for memory."""
    return EngineConfig(model=str(model), serving=ServingConfig.create(
        policy, num_gpu_blocks_override=num_pages, max_model_len=128, **serving))


@pytest.fixture(scope="module")
def live(chat_model) -> Iterator[LiveServer]:
    """A server over the chat model with an API key."""
    server = start_live_server(engine_config(chat_model), api_key=API_KEY)
    yield server
    server.stop()
