"""--length-scale: the same traffic and block sharing with every length divided."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.traces import Trace, TraceRequest, load_trace, scale_lengths


def test_mooncake_scaled_keeps_its_blocks_and_sharing():
    full = load_trace("mooncake", num_prompts=20)
    small = load_trace("mooncake", num_prompts=20, length_scale=16)
    for before, after in zip(full.requests, small.requests, strict=True):
        assert after.hash_block_size == before.hash_block_size // 16 == 32
        assert after.hash_ids == before.hash_ids  # the same blocks, shared as before
        assert after.input_len == -(-before.input_len // 16)
        assert after.output_len == max(1, -(-before.output_len // 16))
        # a prompt still spans exactly its blocks
        assert len(after.hash_ids) == -(-after.input_len // after.hash_block_size)
        assert after.arrival_s == before.arrival_s
    assert small.metadata["length_scale"] == 16


def test_scale_one_is_the_trace_itself():
    trace = load_trace("azure", num_prompts=5)
    assert scale_lengths(trace, 1) is trace


@pytest.mark.parametrize("scale", [0, -2, 1.5, True])
def test_bad_scale_is_an_error(scale):
    with pytest.raises(KvlabError, match="length_scale"):
        scale_lengths(load_trace("azure", num_prompts=2), scale)


def test_scale_must_divide_the_hash_block():
    with pytest.raises(KvlabError, match="divisor of the trace's hash block size 512"):
        load_trace("mooncake", num_prompts=2, length_scale=3)


def test_prompts_with_token_ids_cannot_shrink():
    request = TraceRequest(0, 0.0, 4, 2, prompt_token_ids=(1, 2, 3, 4))
    trace = Trace("t", "random", "test", [request])
    with pytest.raises(KvlabError, match="token ids"):
        scale_lengths(trace, 2)


def test_cli_flag_names_itself(capsys):
    assert main(["sim", "--dataset-name", "mooncake", "--length-scale", "5",
                 "--num-prompts", "3"]) != 0
    assert "--length-scale 5: expected a divisor" in capsys.readouterr().err
