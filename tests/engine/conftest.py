"""Fixtures: tiny random Hugging Face checkpoints saved by transformers, shared by engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_hf_models import save_hf_model, save_tokenizer, tiny_llama_config, tiny_qwen2_config


@pytest.fixture(scope="session")
def hf_tiny_llama(tmp_path_factory) -> Path:
    """Folder of a tiny random Llama (config.json, model.safetensors, a word-level tokenizer)."""
    folder = save_hf_model(tmp_path_factory.mktemp("hf_tiny_llama"), tiny_llama_config())
    save_tokenizer(folder, vocab_size=512)
    return folder


@pytest.fixture(scope="session")
def hf_tiny_qwen2(tmp_path_factory) -> Path:
    """Folder of a tiny random Qwen2 (config.json, model.safetensors; no tokenizer)."""
    return save_hf_model(tmp_path_factory.mktemp("hf_tiny_qwen2"), tiny_qwen2_config(), seed=1)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matmuls on a shared 2-core machine: a second thread only waits on the first (and
    step times measured on one thread are steadier). Modules opt in with `usefixtures`."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)
