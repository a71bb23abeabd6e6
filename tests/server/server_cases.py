"""What the server tests share (a module, not the conftest: `from conftest import` finds
whichever conftest pytest imported first): the API key, the chat model's vocabulary and
template, and a small engine config."""

from __future__ import annotations

from pathlib import Path

from kvlab.engine.config import EngineConfig
from kvlab.policies.serving import ServingConfig

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
API_KEY = "test-key"
VOCAB_SIZE = 82


def engine_config(model: Path | str, policy: str = "paged:block_size=4,eviction=lru",
                  num_pages: int = 64, **serving: object) -> EngineConfig:
    """A small engine: `num_pages` pages of 4 tokens, so that requests compete for memory."""
    return EngineConfig(model=str(model), serving=ServingConfig.create(
        policy, num_gpu_blocks_override=num_pages, max_model_len=128, **serving))
