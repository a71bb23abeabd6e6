"""A vLLM user's flags: one line naming kvlab's way to the same thing, not a usage dump."""

from __future__ import annotations

import pytest

from kvlab.cli import main


@pytest.mark.parametrize(("argv", "words"), [
    (["sim", "--kv-offloading-size", "64"], "--kv-tiers host:SIZE"),
    (["sim", "--pipeline-parallel-size", "2"], "one pipeline stage"),
    (["bench", "serve", "--pipeline-parallel-size", "2"], "one pipeline stage"),
    (["sim", "--dtype", "half"], "--kv-cache-dtype"),
    (["sim", "--max-num-batched-token-count", "8"], "did you mean --max-num-batched-tokens?"),
    (["sim", "--block-size", "abc"], "argument --block-size: invalid int value"),
])
def test_a_flag_kvlab_lacks_is_one_line_naming_its_equivalent(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert words in err and "usage:" not in err


def test_serve_takes_the_model_as_vllm_does_and_once(capsys):
    """`kvlab serve MODEL` or vLLM's `--model MODEL`: neither or both is one line."""
    assert main(["serve"]) == 2
    assert "give the model once" in capsys.readouterr().err
    assert main(["serve", "tiny-llama", "--model", "tiny-llama"]) == 2
    assert "give the model once" in capsys.readouterr().err
