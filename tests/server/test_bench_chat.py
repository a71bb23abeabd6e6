"""`kvlab bench serve` in chat mode (vLLM's openai-chat backend): each prompt sent as one user
message to /v1/chat/completions, its streamed `delta.content` chunks timed, its length the
server's (after the chat template); token-id prompts turned into text by the tokenizer, and
refused by name without one."""

from __future__ import annotations

import argparse

import pytest
from server_cases import API_KEY
from transformers import AutoTokenizer

from kvlab.bench import ClientConfig, bench_serve
from kvlab.cli.commands.bench import endpoint_of
from kvlab.errors import KvlabError
from kvlab.traces import Trace, TraceRequest


def _trace() -> Trace:
    requests = [TraceRequest(i, 0.01 * i, 6 + i, 4 + i % 3) for i in range(6)]
    return Trace("chat", "random", "synthetic", requests, {})


def _client(live, endpoint: str) -> ClientConfig:
    return ClientConfig(base_url=live.base_url, model=live.model_name, endpoint=endpoint,
                        api_key=API_KEY, ignore_eos=True, metrics_path=None)


def test_chat_mode_sends_messages_and_times_the_streamed_content(live, chat_model):
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    texts = []

    def text_of(ids: list[int]) -> str:
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
        return texts[-1]

    result = bench_serve(_trace(), _client(live, "/v1/chat/completions"),
                         card={"id": live.model_name}, vocab_size=60, text_of=text_of)
    records = result.requests
    assert all(r.completed for r in records), [r.error for r in records]
    for record, request, text in zip(records, _trace().requests, texts, strict=True):
        assert record.num_output_tokens == sum(record.chunk_tokens) == request.output_len
        assert record.ttft_s is not None
        templated = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                  add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]
        # the server's ids and count of what it ran: the message under the chat template
        assert record.prompt_token_ids == templated and record.prompt_len == len(templated)


def test_chat_mode_without_text_names_the_tokenizer_flag(live):
    with pytest.raises(KvlabError, match="--tokenizer"):
        bench_serve(_trace(), _client(live, "/v1/chat/completions"),
                    card={"id": live.model_name}, vocab_size=60)


@pytest.mark.parametrize(("backend", "endpoint", "expected"), [
    ("openai", None, "/v1/completions"),
    ("vllm", None, "/v1/completions"),
    ("openai-chat", None, "/v1/chat/completions"),
    ("openai", "/v1/chat/completions", "/v1/chat/completions"),
])
def test_the_route_follows_the_backend_as_vllms_client(backend, endpoint, expected):
    assert endpoint_of(argparse.Namespace(backend=backend, endpoint=endpoint)) == expected


def test_a_chat_backend_on_a_completions_route_is_refused():
    with pytest.raises(KvlabError, match="--endpoint /v1/completions"):
        endpoint_of(argparse.Namespace(backend="openai-chat", endpoint="/v1/completions"))
