"""Bad input through every route: each a clear 4xx in OpenAI's error shape, and the server goes
on serving."""

from __future__ import annotations

import httpx
import pytest
from server_cases import API_KEY, engine_config

from tests.live_server import start_live_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
GOOD = {"prompt": [5, 6, 7], "max_tokens": 2}


@pytest.fixture(scope="module")
def plain():
    """A server over the tiny-llama preset: no tokenizer, so no text and no chat."""
    server = start_live_server(engine_config("tiny-llama", num_pages=32))
    yield server
    server.stop()


BAD_COMPLETIONS = [
    ("not json", b"{prompt: [1, 2", 400, "not valid JSON"),
    ("a list body", b"[1, 2, 3]", 400, "a JSON object"),
    ("no prompt", {"max_tokens": 3}, 400, "prompt"),
    ("a number as prompt", {"prompt": 5}, 400, "prompt"),
    ("ids of the wrong type", {"prompt": [1, "two", 3]}, 400, "prompt"),
    ("float ids", {"prompt": [1.5, 2.0]}, 400, "prompt"),
    ("an empty prompt", {"prompt": []}, 400, "empty"),
    ("an empty text prompt", {"prompt": ""}, 400, "empty"),
    ("ids past the vocabulary", {"prompt": [1, 10**6]}, 400, "outside the vocabulary"),
    ("a negative id", {"prompt": [-1, 2]}, 400, "outside the vocabulary"),
    ("max_tokens as text", {**GOOD, "max_tokens": "ten"}, 400, "max_tokens"),
    ("max_tokens 0", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", {**GOOD, "max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens huge", {**GOOD, "max_tokens": 10**9}, 400, "maximum context length is 128"),
    ("temperature negative", {**GOOD, "temperature": -1}, 400, "temperature"),
    ("temperature as text", {**GOOD, "temperature": "hot"}, 400, "temperature"),
    ("top_p 0", {**GOOD, "top_p": 0}, 400, "top_p"),
    ("top_k -2", {**GOOD, "top_k": -2}, 400, "top_k"),
    ("n 2", {**GOOD, "n": 2}, 400, "only n=1"),
    ("logprobs 2", {**GOOD, "logprobs": 2}, 400, "logprobs: kvlab serve does not return"),
    ("echo", {**GOOD, "echo": True}, 400, "echo: kvlab serve does not return"),
    ("best_of 2", {**GOOD, "best_of": 2}, 400, "best_of: kvlab serve does not return"),
    ("stream_options without stream", {**GOOD, "stream_options": {"include_usage": True}},
     400, "stream_options"),
    ("an unknown model", {**GOOD, "model": "gpt-9"}, 404, "does not exist"),
    ("a bad stop id", {**GOOD, "stop_token_ids": [-3]}, 400, "stop_token_ids"),
]


@pytest.mark.parametrize(("case", "body", "status", "message"), BAD_COMPLETIONS,
                         ids=[case[0] for case in BAD_COMPLETIONS])
def test_a_bad_completion_request_is_a_clear_4xx(live, case, body, status, message):
    url = live.base_url + "/v1/completions"
    if isinstance(body, bytes):
        response = httpx.post(url, content=body, headers=HEADERS)
    else:
        response = httpx.post(url, json=body, headers=HEADERS)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == status
    assert error["type"].endswith("Error")


def test_a_body_over_the_limit_is_refused_unread(live):
    body = b'{"prompt": [' + b"1, " * 4_000_000 + b'1]}'  # 12 MB
    response = httpx.post(live.base_url + "/v1/completions", content=body, headers=HEADERS)
    assert response.status_code == 413
    assert "over" in response.json()["error"]["message"]


def test_a_request_too_large_for_the_memory_is_refused(plain):
    # 32 pages of 4 tokens hold 128 tokens: 100 + 20 fits the model length but not the pages
    small = start_live_server(engine_config("tiny-llama", num_pages=8))
    try:
        response = httpx.post(small.base_url + "/v1/completions",
                              json={"prompt": list(range(3, 100)), "max_tokens": 20})
        assert response.status_code == 400
        assert "needs 30 KV pages but the cache has only 8" in response.json()["error"]["message"]
    finally:
        small.stop()


def test_text_and_chat_need_a_tokenizer(plain):
    response = httpx.post(plain.base_url + "/v1/completions", json={"prompt": "hello"})
    assert response.status_code == 400 and "no tokenizer" in response.json()["error"]["message"]
    response = httpx.post(plain.base_url + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400 and "chat template" in response.json()["error"]["message"]


def test_a_bad_chat_request_is_a_clear_400(live):
    for body in ({"messages": []}, {"messages": [{"role": "user"}]}, {"messages": "hi"}):
        response = httpx.post(live.base_url + "/v1/chat/completions", json=body,
                              headers=HEADERS)
        assert response.status_code == 400, body
        assert response.json()["error"]["param"].startswith("messages")


def test_unknown_routes_and_methods_are_4xx(live):
    assert httpx.get(live.base_url + "/v1/nothing", headers=HEADERS).status_code == 404
    assert httpx.get(live.base_url + "/v1/completions", headers=HEADERS).status_code == 405


def test_the_server_still_serves_after_every_bad_request(live, plain):
    for server, headers in ((live, HEADERS), (plain, {})):
        assert httpx.get(server.base_url + "/health").status_code == 200
        response = httpx.post(server.base_url + "/v1/completions", json=GOOD, headers=headers)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 2


def test_past_max_queue_requests_get_503(chat_model):
    server = start_live_server(engine_config(chat_model), max_queue=1)
    try:
        service = server.service
        with service._lock:  # a full queue, as if a burst were waiting
            service._num_queued = 1
        response = httpx.post(server.base_url + "/v1/completions", json=GOOD)
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "ServiceUnavailableError"
    finally:
        with service._lock:
            service._num_queued = 0
        server.stop()
