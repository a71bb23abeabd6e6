"""`kvlab export-model` folders are served with chat: the exported word tokenizer carries a
chat template, so that `kvlab serve DIR` answers /v1/chat/completions (and its ids are the
message's words after <s>)."""

from __future__ import annotations

import httpx
from server_cases import engine_config
from transformers import AutoTokenizer

from kvlab.cli import main
from tests.live_server import start_live_server


def test_an_exported_folder_answers_chat_completions(tmp_path, capsys):
    folder = tmp_path / "tiny"
    assert main(["export-model", "tiny-llama", str(folder)]) == 0
    assert "Saved tiny-llama" in capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "t7 t9"}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    assert ids == [tokenizer.bos_token_id, 7, 9]
    server = start_live_server(engine_config(folder))
    try:
        body = {"model": server.model_name, "max_tokens": 3, "temperature": 0,
                "ignore_eos": True, "messages": [{"role": "user", "content": "t7 t9"}]}
        response = httpx.post(server.base_url + "/v1/chat/completions", json=body,
                              timeout=60).json()
    finally:
        server.stop()
    (choice,) = response["choices"]
    assert choice["finish_reason"] == "length" and response["usage"]["prompt_tokens"] == 3
    assert len(choice["message"]["content"].split()) == 3  # three words of the vocabulary
