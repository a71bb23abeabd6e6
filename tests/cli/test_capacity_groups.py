"""`kvlab capacity` for models of 2026 (issue 47): "how many 32k-token requests fit for
gpt-oss-120b on one H200, and where do the bytes go", answered with a per-group table."""

from __future__ import annotations

import json

from kvlab.cli import main
from kvlab.specs import get_hardware, get_model, kv_cache_capacity_tokens

ASK = ["capacity", "--model", "gpt-oss-120b", "--hardware", "h200", "--max-model-len", "32768"]


def test_the_answer_counts_pages_in_every_group_as_vllm_does(capsys):
    assert main([*ASK, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["answers"][0]
    capacity = kv_cache_capacity_tokens(get_model("gpt-oss-120b"), get_hardware("h200-141g"),
                                        page_size=16)
    assert answer["num_gpu_blocks"] == capacity.num_pages
    groups = answer["groups"]
    assert [g["group"] for g in groups] == ["sliding_window(128)", "full"]
    assert [g["pages_per_request"] for g in groups] == [1033, 2048]
    assert answer["max_concurrency"] == capacity.num_pages / (1033 + 2048)


def test_the_table_shows_where_the_bytes_go(capsys):
    assert main(ASK) == 0
    out = capsys.readouterr().out
    assert "one request of 32,768 tokens, by KV-cache group" in out
    assert "sliding_window(128)  18" in out and "total" in out


def test_fewer_batched_tokens_shrink_the_sliding_group(capsys):
    assert main([*ASK, "--json", "--max-num-batched-tokens", "2048", "--no-async-scheduling"]) \
        == 0
    groups = json.loads(capsys.readouterr().out)["answers"][0]["groups"]
    assert groups[0]["pages_per_request"] == -(-(127 + 2048) // 16) + 1


def test_a_raised_block_size_is_a_warning(capsys):
    assert main(["capacity", "--model", "qwen3-next-80b-a3b", "--hardware", "h200",
                 "--tensor-parallel-size", "2", "--max-model-len", "32768"]) == 0
    captured = capsys.readouterr()
    assert "pages of 544 tokens" in captured.out
    assert "raises the attention pages to 544 tokens" in captured.err


def test_a_plain_model_prints_no_group_table(capsys):
    assert main(["capacity", "--model", "llama-3.1-8b", "--hardware", "h200"]) == 0
    assert "by KV-cache group" not in capsys.readouterr().out


def test_bad_batched_tokens_are_one_line(capsys):
    assert main([*ASK, "--max-num-batched-tokens", "0"]) == 2
    assert "--max-num-batched-tokens 0: expected 1 or more" in capsys.readouterr().err
