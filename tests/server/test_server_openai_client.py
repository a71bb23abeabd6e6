"""A stock `openai` client against `kvlab serve`: completions and chat, whole and streamed."""

from __future__ import annotations

import pytest
from server_cases import API_KEY

openai = pytest.importorskip("openai", reason="the openai package is a dev extra")


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.base_url + "/v1", api_key=API_KEY, max_retries=0)


def test_the_openai_client_lists_the_model_and_completes(client, live):
    assert [model.id for model in client.models.list()] == [live.model_name]
    completion = client.completions.create(model=live.model_name, prompt="the cat is",
                                           max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 5


def test_the_openai_client_streams_a_completion(client, live):
    whole = client.completions.create(model=live.model_name, prompt="the cat is", max_tokens=6,
                                      temperature=0, extra_body={"ignore_eos": True})
    stream = client.completions.create(model=live.model_name, prompt="the cat is", max_tokens=6,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 6


def test_the_openai_client_chats_whole_and_streamed(client, live):
    messages = [{"role": "user", "content": "the cat is"}]
    reply = client.chat.completions.create(model=live.model_name, messages=messages,
                                           max_tokens=4, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=live.model_name, messages=messages,
                                            max_tokens=4, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == reply.choices[0].message.content


def test_the_openai_client_raises_its_own_errors(client, live):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=live.model_name, prompt="hi", max_tokens=10**6)
    bad = openai.OpenAI(base_url=live.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
