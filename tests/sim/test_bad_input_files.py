"""Bad input that used to end in a traceback (issue 15): binary files where text is expected,
token counts past int64, a negative seed, more pages than this machine can keep books for.
Each is one line naming the file, line or flag, exit 2."""

from __future__ import annotations

import pytest

from kvlab.cli import main

SIM = ["sim", "--num-prompts", "2", "--disable-tqdm"]


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "blob.yaml"
    path.write_bytes(bytes(range(128, 256)) * 8)
    return path


def _one_line_error(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_a_binary_mooncake_trace(binary, capsys):
    assert main([*SIM, "--dataset-name", "mooncake", "--dataset-path", str(binary)]) == 2
    _one_line_error(capsys, f"{binary} line 1: not UTF-8 text")


def test_a_binary_cost_model(binary, capsys):
    assert main([*SIM, "--cost-model", str(binary)]) == 2
    _one_line_error(capsys, "--cost-model", "not a text file")


def test_a_binary_model_spec(binary, capsys):
    assert main([*SIM, "--model", str(binary)]) == 2
    _one_line_error(capsys, f"{binary}: not a text file")


def test_token_counts_past_int64_name_the_line_and_column(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,99999999999999999999999,5\n")
    assert main([*SIM, "--dataset-name", "azure", "--dataset-path", str(path)]) == 2
    _one_line_error(capsys, "line 2, column ContextTokens", "is too large")
    assert main(["traces", "info", str(path)]) == 2
    _one_line_error(capsys, "is too large")


def test_a_mooncake_length_past_the_limit(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 99999999999999, '
                    '"hash_ids": [1]}\n')
    assert main([*SIM, "--dataset-name", "mooncake", "--dataset-path", str(path)]) == 2
    _one_line_error(capsys, "line 1, field output_length", "is too large")


def test_a_negative_seed(capsys):
    assert main([*SIM, "--seed", "-1", "--request-rate", "5"]) == 2
    _one_line_error(capsys, "--seed -1: expected a whole number >= 0")


def test_more_pages_than_the_books_fit_in_ram(capsys):
    assert main([*SIM, "--num-gpu-blocks-override", str(10**12)]) == 2
    _one_line_error(capsys, "--num-gpu-blocks-override", "GiB of RAM available")
