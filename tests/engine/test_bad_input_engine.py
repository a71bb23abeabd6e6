"""Bad input to the real engine that used to end in a traceback or an allocator error (issue
15): more KV memory than this machine has, a model config with a zero dimension, a corrupt
safetensors file. One line naming the flag or file, exit 2, checked before allocating."""

from __future__ import annotations

import json
import shutil

import pytest

from kvlab.cli import main

RUN = ["run", "--num-prompts", "1", "--disable-tqdm"]


def _one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("flags", [
    ["--num-gpu-blocks-override", str(10**8)],
    ["--kv-cache-memory", "1TiB"],
])
def test_more_kv_memory_than_the_machine_has(flags, capsys):
    assert main([*RUN, *flags]) == 2
    _one_line_error(capsys, "GiB free on cpu", "--num-gpu-blocks-override")


def test_a_zero_dimension_in_config_json(hf_tiny_llama, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(hf_tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    assert main([*RUN, "--model", str(folder)]) == 2
    _one_line_error(capsys, "config.json: 'num_attention_heads'", "whole number >= 1 (got 0)")


def test_a_corrupt_safetensors_file(hf_tiny_llama, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(hf_tiny_llama, folder)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:64])  # truncated
    assert main([*RUN, "--model", str(folder)]) == 2
    _one_line_error(capsys, f"{weights}: not a readable safetensors file")


def test_an_unknown_device_names_the_flag(capsys):
    assert main([*RUN, "--device", "quantum"]) == 2
    _one_line_error(capsys, "--device 'quantum': expected one of cpu, cuda, npu")


def test_triton_on_cpu_without_the_interpreter_says_how(monkeypatch, capsys):
    # Triton fixes interpreted or compiled kernels when their module is imported: import it
    # under the tests' TRITON_INTERPRET=1 first, so that later tests still get interpreted ones
    import kvlab.kernels.triton_backend  # noqa: F401

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main([*RUN, "--attention-backend", "triton"]) == 2
    _one_line_error(capsys, "--attention-backend triton on cpu needs Triton's interpreter",
                    "TRITON_INTERPRET=1")
