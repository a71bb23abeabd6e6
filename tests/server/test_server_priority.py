"""`kvlab serve --scheduling-policy priority`: the API's `priority` field (vLLM's extension) on
completions and chat reaches the scheduler; a server scheduling otherwise refuses a priority
other than 0, as vLLM does."""

from __future__ import annotations

import httpx
import pytest
from server_cases import engine_config

from tests.live_server import record_priorities, start_live_server


@pytest.fixture(scope="module")
def priority_live(chat_model):
    server = start_live_server(engine_config(chat_model, scheduling_policy="priority"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fcfs_live(chat_model):
    server = start_live_server(engine_config(chat_model))
    yield server
    server.stop()


def test_priority_reaches_the_scheduler_from_completions_and_chat(priority_live, monkeypatch):
    engine = priority_live.service.engine
    seen = record_priorities(priority_live, monkeypatch)
    base = priority_live.base_url
    reply = httpx.post(base + "/v1/completions", timeout=60, json={
        "prompt": [5, 9, 14], "max_tokens": 3, "priority": -2})
    assert reply.status_code == 200, reply.text
    reply = httpx.post(base + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "priority": 4})
    assert reply.status_code == 200, reply.text
    assert seen == [-2, 4]
    assert engine.config.serving.scheduling_policy == "priority"


def test_a_fcfs_server_refuses_a_priority_as_vllm_does(fcfs_live):
    reply = httpx.post(fcfs_live.base_url + "/v1/completions", timeout=60, json={
        "prompt": [5, 9, 14], "max_tokens": 3, "priority": 1})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "priority" and "--scheduling-policy priority" in error["message"]
    ok = httpx.post(fcfs_live.base_url + "/v1/completions", timeout=60, json={
        "prompt": [5, 9, 14], "max_tokens": 3, "priority": 0})
    assert ok.status_code == 200
