"""`kvlab traces info` and `kvlab traces list` through kvlab.cli.main."""

import pytest

from kvlab.cli import main


def test_info_on_a_bundled_name_prints_the_table(capsys):
    assert main(["traces", "info", "azure-conv"]) == 0
    out = capsys.readouterr().out
    assert "Requests:" in out and "2,867" in out
    assert "Mean request rate (req/s):" in out
    assert out.splitlines()[-3].split() == ["Tokens", "mean", "p50", "p90", "p99", "max"]


def test_info_guesses_mooncake_and_shows_prefix_sharing(capsys, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1,2]}\n'
                    '{"timestamp": 9, "input_length": 100, "output_length": 3, "hash_ids": [1]}')
    assert main(["traces", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Dataset:                                mooncake" in out
    assert "Prefix sharing (512-token blocks):      33.3%" in out


def test_info_applies_num_prompts_and_request_rate(capsys):
    assert main(["traces", "info", "mooncake", "--num-prompts", "40", "--request-rate", "2"]) == 0
    out = capsys.readouterr().out
    assert "Requests:                               40\n" in out
    assert "Resampled rate (req/s):                 2.0" in out


def test_info_on_a_bad_file_exits_2_with_one_stderr_line(capsys, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,ten,1\n")
    assert main(["traces", "info", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"kvlab traces: error: {path} line 2, column ContextTokens: 'ten' is "
                            "not a whole number\n")


def test_list_names_every_bundled_excerpt(capsys):
    assert main(["traces", "list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[:3]]
    assert names == ["azure-conv", "azure-code", "mooncake"]


@pytest.mark.parametrize("flag, value", [("--num-prompts", "0"), ("--time-scale", "0")])
def test_a_bad_value_names_the_subcommands_flag(flag, value, capsys):
    assert main(["traces", "info", "azure-conv", flag, value]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"kvlab traces: error: {flag} ") and "_" not in error.split(":")[2]
