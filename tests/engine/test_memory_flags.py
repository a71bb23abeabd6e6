"""Memory flags mean what vLLM's do (issue 15 #3): `--swap-space 4` is 4 GiB, a size with a
unit is that size, and vLLM's `--kv-cache-memory-bytes` is accepted beside kvlab's name."""

from __future__ import annotations

import argparse

import pytest

from kvlab.cli import main
from kvlab.cli.commands.common import add_serving_arguments, serving_config

GiB = 2**30


def _serving(*argv: str):
    parser = argparse.ArgumentParser()
    add_serving_arguments(parser.add_argument_group(), parser.add_argument_group(), engine=True)
    parser.add_argument("--seed", type=int, default=0)  # the workload's flag, read as well
    return serving_config(parser.parse_args(argv))


@pytest.mark.parametrize("flag, expected", [
    ("4", 4 * GiB), ("0.5", GiB // 2), ("512MiB", 512 * 2**20), ("0", 0)])
def test_swap_space_is_gib_as_in_vllm(flag, expected):
    assert _serving("--swap-space", flag).swap_space_bytes == expected


def test_the_default_swap_space_is_vllms_4_gib():
    assert _serving().swap_space_bytes == 4 * GiB


def test_kv_cache_memory_takes_vllms_name_in_bytes():
    assert _serving("--kv-cache-memory-bytes", "1048576").kv_cache_memory_bytes == 2**20
    assert _serving("--kv-cache-memory", "2MiB").kv_cache_memory_bytes == 2 * 2**20


def test_a_bad_swap_space_names_the_flag_and_the_unit(capsys):
    assert main(["run", "--swap-space", "lots", "--num-prompts", "1"]) == 2
    err = capsys.readouterr().err
    assert "--swap-space 'lots'" in err and "(in GiB)" in err and "Traceback" not in err


def test_gpu_memory_utilization_on_cpu_is_said_to_size_nothing(capsys):
    """On cpu the KV cache is sized by bytes or pages: a utilization is said to do nothing,
    once, among the start-up lines (not ignored in silence)."""
    from kvlab.engine import LLM

    llm = LLM("tiny-llama", gpu_memory_utilization=0.5, num_gpu_blocks_override=16)
    assert capsys.readouterr().err.count("gpu_memory_utilization 0.5 sizes no KV cache") == 1
    assert len(llm.engine.startup_lines) == 2
    assert len(LLM("tiny-llama", num_gpu_blocks_override=16, verbose=False)
               .engine.startup_lines) == 1
