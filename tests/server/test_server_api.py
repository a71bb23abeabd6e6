"""`kvlab serve`'s endpoints: vLLM's shapes, the offline engine's tokens, streaming, text and
chat, stop strings and stop ids, sampling seeds, metrics, the API key, aborts."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_cases import API_KEY
from transformers import AutoTokenizer

from kvlab.engine import LLM, SamplingParams

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
PROMPTS = [[5, 9, 14, 3, 77, 21], [10, 11, 12], list(range(40, 70))]


def _post(live, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(live.base_url + path, json=body, headers=HEADERS, timeout=60, **kwargs)


def _stream(live, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed response, up to [DONE]."""
    chunks = []
    with httpx.stream("POST", live.base_url + path, json={**body, "stream": True},
                      headers=HEADERS, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                return chunks
            chunks.append(json.loads(line[len("data: "):]))
    raise AssertionError("the stream ended without [DONE]")


@pytest.fixture(scope="module")
def offline(chat_model):
    """Greedy tokens of the offline engine for PROMPTS (8 tokens each, eos ignored)."""
    llm = LLM(str(chat_model), verbose=False)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, params, use_tqdm=False)]


def test_a_completion_has_vllms_shape_and_the_offline_greedy_tokens(live, offline):
    response = _post(live, "/v1/completions", {"model": live.model_name, "prompt": PROMPTS[0],
                     "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                     "return_token_ids": True})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == live.model_name
    (choice,) = body["choices"]
    assert choice["token_ids"] == offline[0] and choice["prompt_token_ids"] == PROMPTS[0]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}


def test_a_stream_carries_the_same_tokens_then_usage_then_done(live, offline):
    chunks = _stream(live, "/v1/completions", {"prompt": PROMPTS[2], "max_tokens": 8,
                     "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                     "stream_options": {"include_usage": True}})
    *token_chunks, usage = chunks
    ids = [t for chunk in token_chunks for t in chunk["choices"][0]["token_ids"]]
    assert ids == offline[2]
    assert token_chunks[0]["choices"][0]["prompt_token_ids"] == PROMPTS[2]
    assert [c["choices"][0]["finish_reason"] for c in token_chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in token_chunks[:-1])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8


def test_several_prompts_are_choices_in_prompt_order(live, offline):
    body = _post(live, "/v1/completions", {"prompt": PROMPTS, "max_tokens": 8,
                 "temperature": 0, "ignore_eos": True, "return_token_ids": True}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["token_ids"] for c in body["choices"]] == offline


def test_text_prompts_are_tokenized_and_outputs_detokenized(live, chat_model):
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    body = _post(live, "/v1/completions", {"prompt": "the cat is on the way", "max_tokens": 6,
                 "temperature": 0, "ignore_eos": True, "return_token_ids": True}).json()
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == tokenizer("the cat is on the way")["input_ids"]
    assert body["usage"]["prompt_tokens"] == len(choice["prompt_token_ids"])
    assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["text"]


def test_a_stop_string_ends_the_text_before_it(live):
    request = {"prompt": "the cat is on the way", "max_tokens": 8, "temperature": 0,
               "ignore_eos": True}
    words = _post(live, "/v1/completions", request).json()["choices"][0]["text"].split()
    stop = " " + words[3]
    choice = _post(live, "/v1/completions", {**request, "stop": [stop]}).json()["choices"][0]
    assert choice["text"] == " ".join(words[:3])
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    streamed = _stream(live, "/v1/completions", {**request, "stop": stop})
    assert "".join(c["choices"][0]["text"] for c in streamed) == " ".join(words[:3])


def test_a_stop_token_id_ends_the_completion_on_it(live, offline):
    stop_id = offline[0][3]
    choice = _post(live, "/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 8,
                   "temperature": 0, "ignore_eos": True, "stop_token_ids": [stop_id],
                   "return_token_ids": True}).json()["choices"][0]
    assert choice["token_ids"] == offline[0][:4]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id


def test_a_seeded_sample_repeats(live):
    request = {"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 1.0, "seed": 7,
               "ignore_eos": True, "return_token_ids": True}
    first, second = (_post(live, "/v1/completions", request).json() for _ in range(2))
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]


def test_chat_completions_apply_the_chat_template(live, chat_model):
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    request = {"messages": [{"role": "user", "content": "the cat is"}], "max_tokens": 5,
               "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    body = _post(live, "/v1/chat/completions", request).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["content"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["prompt_token_ids"] == tokenizer("the cat is ")["input_ids"]
    assert body["usage"]["completion_tokens"] == 5
    chunks = _stream(live, "/v1/chat/completions", request)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_models_health_version_and_metrics(live):
    models = httpx.get(live.base_url + "/v1/models", headers=HEADERS).json()
    assert [m["id"] for m in models["data"]] == [live.model_name]
    assert models["data"][0]["max_model_len"] == 128
    assert httpx.get(live.base_url + "/health").status_code == 200
    assert "version" in httpx.get(live.base_url + "/version").json()
    text = httpx.get(live.base_url + "/metrics").text
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:request_queue_time_seconds_bucket", "vllm:iteration_tokens_total_bucket",
                 "vllm:request_prefill_time_seconds_bucket",
                 "vllm:cache_config_info", "kvlab:kv_pages_used", "kvlab:kv_pages_cached_free",
                 "kvlab:kv_pages_free", "kvlab:host_pages_used",
                 "kvlab:internal_fragmentation_perc", "kvlab:external_fragmentation_pages",
                 "kvlab:swaps_out_total", "kvlab:swaps_in_total", "kvlab:policy_info"):
        assert name in text, name
    assert 'cache_dtype="auto"' in text  # vLLM's label: what a benchmark client simulates


def test_v1_routes_want_the_api_key_and_the_others_do_not(live):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.post(live.base_url + "/v1/completions", headers=headers,
                              json={"prompt": [1, 2]})
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "AuthenticationError"
    assert httpx.get(live.base_url + "/v1/models").status_code == 401
    assert httpx.get(live.base_url + "/metrics").status_code == 200
    # the one state-changing route outside /v1 wants the key too
    assert httpx.post(live.base_url + "/reset_prefix_cache").status_code == 401
    reset = httpx.post(live.base_url + "/reset_prefix_cache", headers=HEADERS)
    assert reset.status_code == 200 and reset.json() == {"success": True}


def _metric(live, name: str) -> float:
    values = _metrics(live)
    if name not in values:
        raise AssertionError(f"{name} is not exported")
    return values[name]


def test_ttft_is_counted_when_the_first_token_goes_out_not_at_the_end(live):
    # as vLLM's: a scrape during a run sees the TTFT of every request with a token out
    before = _metric(live, "vllm:time_to_first_token_seconds_count")
    body = {"prompt": PROMPTS[2], "max_tokens": 90, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", live.base_url + "/v1/completions", json=body, headers=HEADERS,
                      timeout=60) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        assert _metric(live, "vllm:num_requests_running") == 1  # still running
        assert _metric(live, "vllm:time_to_first_token_seconds_count") == before + 1
        for _ in lines:
            pass
    assert _metric(live, "vllm:time_to_first_token_seconds_count") == before + 1  # once


def test_a_whole_responses_ttft_is_counted_at_its_first_token_too(live):
    # not streamed: the tokens go out at the end, but vLLM counts the TTFT at the first
    before = _metric(live, "vllm:time_to_first_token_seconds_count")
    body = {"prompt": PROMPTS[2], "max_tokens": 90, "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(httpx.post, live.base_url + "/v1/completions", json=body,
                            headers=HEADERS, timeout=60)
        seen_while_running = False
        while not reply.done() and not seen_while_running:
            scrape = _metrics(live)
            seen_while_running = (scrape["vllm:num_requests_running"] == 1 and
                                  scrape["vllm:time_to_first_token_seconds_count"] == before + 1)
        assert reply.result().status_code == 200
    assert seen_while_running, "the TTFT was counted only when the request ended"
    assert _metric(live, "vllm:time_to_first_token_seconds_count") == before + 1  # once


def _metrics(live) -> dict[str, float]:
    """One scrape: each series' first sample by name."""
    values: dict[str, float] = {}
    for line in httpx.get(live.base_url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            values.setdefault(name, float(line.rsplit(" ", 1)[1]))
    return values


def test_a_client_leaving_mid_stream_frees_the_requests_pages(live):
    body = {"prompt": PROMPTS[2], "max_tokens": 90, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", live.base_url + "/v1/completions", json=body, headers=HEADERS,
                      timeout=60) as response:
        lines = response.iter_lines()
        next(lines)
        assert _metric(live, "kvlab:kv_pages_used") > 0
    deadline = time.monotonic() + 10
    while _metric(live, "kvlab:kv_pages_used") or _metric(live, "vllm:num_requests_running"):
        assert time.monotonic() < deadline, "the aborted request still holds pages"
        time.sleep(0.02)
