"""A bounded loopback load test: 1,000 requests from 64 concurrent clients, streamed and not,
a tenth of the streams cancelled midway, on a cache small enough to preempt. Every request
that was not cancelled gets the offline engine's greedy tokens; none is lost; no page or host
page is held at the end; the server logs no error."""

from __future__ import annotations

import asyncio
import logging
import random

import httpx
import pytest
from server_cases import API_KEY, engine_config

from kvlab.engine import LLM, SamplingParams
from tests.live_server import start_live_server

NUM_REQUESTS = 1000
CONCURRENCY = 64
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
POLICY = "paged:block_size=4,eviction=lru,preemption=swap"


def _workload(vocab_size: int) -> list[tuple[list[int], int, str]]:
    """(prompt, max_tokens, mode) per request; modes: plain, stream, cancel (a stream the client
    leaves after its first chunk). Prompts share prefixes, so the prefix cache is hit."""
    rng = random.Random(11)
    shared = [rng.randrange(3, vocab_size) for _ in range(16)]
    work = []
    for index in range(NUM_REQUESTS):
        own = [rng.randrange(3, vocab_size) for _ in range(rng.randint(1, 20))]
        prompt = shared[: rng.choice([0, 4, 8, 16])] + own
        mode = "cancel" if index % 10 == 3 else rng.choice(["plain", "stream"])
        work.append((prompt, rng.randint(1, 12), mode))
    return work


async def _one(client: httpx.AsyncClient, prompt: list[int], max_tokens: int,
               mode: str) -> list[int] | None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    if mode == "plain":
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["token_ids"]
    ids: list[int] = []
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                return ids
            if line.startswith("data: "):
                chunk = httpx.Response(200, content=line[6:]).json()
                ids += chunk["choices"][0]["token_ids"]
                if mode == "cancel":
                    return None  # leave mid-stream: closing the response drops the connection
    raise AssertionError("a stream ended without [DONE]")


async def _run(base_url: str, work: list) -> list[list[int] | None]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, headers=HEADERS, limits=limits,
                                 timeout=120) as client:
        async def bounded(item):
            async with gate:
                return await _one(client, *item)

        return await asyncio.gather(*(bounded(item) for item in work))


def _metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.timeout(600)
def test_a_thousand_concurrent_requests_all_finish_with_offline_tokens(chat_model, caplog):
    server = start_live_server(engine_config(chat_model, POLICY, num_pages=48),
                               api_key=API_KEY)
    try:
        vocab_size = server.service.engine.model_config.vocab_size
        work = _workload(vocab_size)
        with caplog.at_level(logging.WARNING, logger="kvlab.server"):
            results = asyncio.run(_run(server.base_url, work))
        metrics = httpx.get(server.base_url + "/metrics").text
    finally:
        server.stop()
    offline = LLM(str(chat_model), verbose=False).generate(
        [prompt for prompt, _, _ in work],
        [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n, _ in work],
        use_tqdm=False,
    )
    for (prompt, _, mode), got, want in zip(work, results, offline, strict=True):
        if mode != "cancel":
            assert got == want.outputs[0].token_ids, prompt
    assert sum(mode == "cancel" for _, _, mode in work) == 100
    assert _metric(metrics, "kvlab:kv_pages_used") == 0
    assert _metric(metrics, "kvlab:host_pages_used") == 0
    assert _metric(metrics, "vllm:num_requests_running") == 0
    assert _metric(metrics, "vllm:num_preemptions_total") > 0  # memory was contended
    assert _metric(metrics, "vllm:prefix_cache_hits_total") > 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
