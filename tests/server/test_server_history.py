"""A server keeps bounded history: without `--profile-path` the step rows, inter-token gaps and
precision mix are dropped every `history_steps` steps (a server runs for days); with it every
row is kept for the profile."""

from __future__ import annotations

import httpx
from server_cases import API_KEY

from kvlab.engine.config import EngineConfig
from kvlab.policies.serving import ServingConfig
from tests.live_server import start_live_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def _serve(keep_steps: bool) -> tuple[int, int, int]:
    """Rows, gaps and mix rows a demoting server holds after 24 steps of one request; its
    /metrics observed every one of the request's 23 inter-token gaps either way."""
    engine = EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4,precision=age:recent=4,depth=2", num_gpu_blocks_override=32))
    server = start_live_server(engine, api_key=API_KEY)
    service = server.service
    service.keep_steps, service.history_steps = keep_steps, 8
    try:
        body = {"prompt": list(range(3, 23)), "max_tokens": 24, "temperature": 0,
                "ignore_eos": True}
        with httpx.Client(base_url=server.base_url, headers=HEADERS, timeout=60) as client:
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
    finally:
        server.stop()  # (the engine thread observes its last step before it stops)
    itls = [line for line in service.metrics.exposition().decode().splitlines()
            if line.startswith("vllm:inter_token_latency_seconds_count")]
    assert float(itls[0].rsplit(" ", 1)[1]) == 23
    precision = service.engine.manager.precision
    assert precision is not None
    return len(service.steps), len(service.engine.scheduler.itls_s), len(precision.mix)


def test_a_server_without_a_profile_drops_its_history():
    rows, gaps, mix = _serve(keep_steps=False)
    assert rows < 8 and gaps < 8 and mix < 8


def test_a_server_writing_a_profile_keeps_every_step():
    rows, gaps, mix = _serve(keep_steps=True)
    assert rows >= 24 and gaps == 23 and mix == rows
