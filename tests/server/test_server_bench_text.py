"""`kvlab bench serve` sends a trace's text where it has text (ShareGPT), as vLLM's client does:
the server tokenizes it, and the record keeps the server's prompt ids and count."""

from __future__ import annotations

import json

from server_cases import API_KEY
from transformers import AutoTokenizer

from kvlab.bench import ClientConfig, bench_serve, plan_requests, resolve_model
from kvlab.traces import load_sharegpt

PROMPTS = ["the cat is on the way", "the way is on the cat and the cat is on the way"]


def _sharegpt(tmp_path):
    entries = [{"id": str(i), "conversations": [{"from": "human", "value": text},
                                                {"from": "gpt", "value": "the cat " * 3}]}
               for i, text in enumerate(PROMPTS)]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))
    return path


def test_sharegpt_prompts_are_sent_as_text(live, chat_model, tmp_path):
    trace = load_sharegpt(_sharegpt(tmp_path))  # no tokenizer: lengths are estimates
    assert [r.prompt_text for r in trace.requests] == PROMPTS
    assert [p.prompt for p in plan_requests(trace, 82, 0)] == PROMPTS

    card = resolve_model(live.base_url, None, API_KEY)
    client = ClientConfig(base_url=live.base_url, model=live.model_name, api_key=API_KEY,
                          ignore_eos=True)
    result = bench_serve(trace, client, card=card, vocab_size=82)
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    for record, text in zip(result.requests, PROMPTS, strict=True):
        assert record.completed, record.error
        expected = tokenizer(text)["input_ids"]
        assert record.prompt_token_ids == expected  # the server tokenized the text
        assert record.prompt_len == len(expected)  # its count, not the 4-character estimate
    assert result.summary()["total_input_tokens"] == sum(len(tokenizer(t)["input_ids"])
                                                        for t in PROMPTS)


def test_sharegpt_with_a_tokenizer_keeps_the_text_and_its_ids(chat_model, tmp_path):
    trace = load_sharegpt(_sharegpt(tmp_path), tokenizer=chat_model)
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    for request, text in zip(trace.requests, PROMPTS, strict=True):
        assert request.prompt_text == text
        assert list(request.prompt_token_ids) == tokenizer(text)["input_ids"]
