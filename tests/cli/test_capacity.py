"""`kvlab capacity` (issue 15 #8): "how many 4k-token requests fit for Llama-3.1-8B on an Atlas
800T A2, block 128 vs 16?" without a simulation; the same numbers `kvlab sim` prints; the
platform's block-size rule as a warning, also from `kvlab sim`."""

from __future__ import annotations

import json

from kvlab.cli import main
from kvlab.specs import get_hardware, get_model
from kvlab.specs.capacity import kv_cache_capacity_tokens

ASK = ["capacity", "--model", "llama-3.1-8b", "--hardware", "atlas-800t-a2",
       "--block-size", "16", "128", "--max-model-len", "4096"]


def test_the_answer_per_block_size_matches_the_capacity_model(capsys):
    assert main([*ASK, "--json"]) == 0
    answers = json.loads(capsys.readouterr().out)["answers"]
    model, hardware = get_model("llama-3.1-8b"), get_hardware("atlas-800t-a2")
    for answer, block_size in zip(answers, (16, 128), strict=True):
        capacity = kv_cache_capacity_tokens(model, hardware, page_size=block_size)
        assert answer["block_size"] == block_size
        assert answer["num_gpu_blocks"] == capacity.num_pages
        assert answer["kv_cache_size_tokens"] == capacity.num_pages * block_size
        assert answer["max_concurrency"] == capacity.max_concurrency(4096)
    assert answers[0]["warnings"] and not answers[1]["warnings"]  # Ascend runs 128


def test_the_table_and_the_warning(capsys):
    assert main(ASK) == 0
    captured = capsys.readouterr()
    assert "requests of 4,096 tokens at once" in captured.out
    assert captured.out.count("x\n") == 2
    assert "block_size 16: vLLM-Ascend runs 128" in captured.err


def test_sim_warns_of_the_same_rule(capsys):
    assert main(["sim", "--model", "llama-3.1-8b", "--hardware", "atlas-800t-a2",
                 "--num-prompts", "2", "--max-model-len", "4096", "--disable-tqdm"]) == 0
    assert "block_size 16: vLLM-Ascend runs 128" in capsys.readouterr().err


def test_bad_numbers_are_one_line(capsys):
    assert main([*ASK[:5], "--block-size", "0"]) == 2
    assert "--block-size 0: expected 1 or more" in capsys.readouterr().err
    # a length past the model's is refused, as sim refuses it (not 0.00x requests)
    assert main([*ASK[:5], "--max-model-len", "1000000000"]) == 2
    assert "expected 1 to 131,072, the context length" in capsys.readouterr().err


def test_a_fixed_kv_size_sizes_the_answer_as_sim_does(capsys):
    """--kv-cache-memory and --num-gpu-blocks-override: the numbers `kvlab sim` sizes its
    cache from with the same flags (the override wins)."""
    model, hardware = get_model("llama-3.1-8b"), get_hardware("atlas-800t-a2")
    assert main([*ASK, "--kv-cache-memory", "8GiB", "--json"]) == 0
    answers = json.loads(capsys.readouterr().out)["answers"]
    for answer, block_size in zip(answers, (16, 128), strict=True):
        expected = kv_cache_capacity_tokens(model, hardware, page_size=block_size,
                                            kv_cache_memory_bytes=8 << 30)
        assert answer["num_gpu_blocks"] == expected.num_pages == (8 << 30) // answer["page_bytes"]
    assert main([*ASK, "--kv-cache-memory", "8GiB", "--num-gpu-blocks-override", "100"]) == 0
    out = capsys.readouterr().out
    assert "num_gpu_blocks_override 100" in out and out.count("        100 ") == 2


def test_a_bad_kv_size_names_the_flag(capsys):
    assert main([*ASK, "--kv-cache-memory", "8Gx"]) == 2
    assert "--kv-cache-memory '8Gx': expected a size" in capsys.readouterr().err
    assert main([*ASK, "--kv-cache-memory", "1KiB"]) == 2
    assert "--kv-cache-memory is 1,024" in capsys.readouterr().err
