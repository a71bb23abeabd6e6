"""`kvlab sim` through kvlab.cli.main: the report, comparisons, result files and user errors."""

import json

import pandas as pd
import pytest

from kvlab.cli import main

FAST = ["--num-prompts", "150", "--disable-tqdm"]


def test_default_run_prints_the_startup_lines_then_the_report(capsys):
    assert main(["sim", "--disable-tqdm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("GPU KV cache size: 118,992 tokens, Maximum concurrency for 4,096 "
                        "tokens per request: 29.05x")
    assert lines[1].startswith("=") and "Serving Benchmark Result" in lines[1]
    text = "\n".join(lines)
    for label in (
        "Successful requests:",
        "Output token throughput (tok/s):",
        "P99 TPOT (ms):",
        "KV slots holding token states (%):",
        "Policy:",
    ):
        assert label in text
    assert "azure-conv excerpt" in text


def test_kv_cache_memory_sizes_the_cache_as_vllms_flag(capsys):
    assert main(["sim", *FAST, "--kv-cache-memory", "2GiB"]) == 0
    # Llama-2-7B: 512 KiB a token, so 2 GiB is 4,096 tokens, 256 pages of 16
    assert capsys.readouterr().out.splitlines()[0].startswith("GPU KV cache size: 4,096 tokens,")


def test_compare_prints_the_policies_side_by_side(capsys):
    code = main(["sim", *FAST, "--compare", "paged", "contiguous:reserve=pow2"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("[1] GPU KV cache size: 118,992 tokens,")
    assert "Policy Comparison" in out
    assert "[1] paged" in out and "[2] contiguous:reserve=pow2" in out
    row = next(line for line in out.splitlines() if line.startswith("KV slots holding"))
    paged, contiguous = (float(v) for v in row.split()[-2:])
    assert paged > contiguous


def test_save_result_writes_the_summary_and_both_tables(tmp_path, capsys):
    code = main(
        [
            "sim",
            *FAST,
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "run.json",
            "--percentile-metrics",
            "ttft,e2el",
            "--metric-percentiles",
            "50,99",
            "--goodput",
            "ttft:2000",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "run.json").read_text())
    for key in (
        "duration",
        "completed",
        "failed",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "p50_ttft_ms",
        "p99_e2el_ms",
        "kv_token_state_perc",
        "num_preemptions",
        "kv_cache_size_tokens",
        "policy",
        "model",
        "hardware",
    ):
        assert key in summary
    assert summary["num_prompts"] == 150 and summary["backend"] == "sim"
    requests = pd.read_csv(tmp_path / "run.requests.csv")
    steps = pd.read_csv(tmp_path / "run.steps.csv")
    assert len(requests) == 150
    assert summary["completed"] + summary["failed"] == 150
    assert steps["num_decode_tokens"].sum() > 0
    assert "Saved" in capsys.readouterr().out


def test_save_result_can_write_parquet_tables(tmp_path):
    code = main(
        [
            "sim",
            *FAST,
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "run.json",
            "--table-format",
            "parquet",
        ]
    )
    assert code == 0
    assert len(pd.read_parquet(tmp_path / "run.requests.parquet")) == 150


def test_compared_policies_are_saved_under_numbered_names(tmp_path):
    code = main(
        [
            "sim",
            *FAST,
            "--compare",
            "paged",
            "paged:block_size=32",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "cmp.json",
        ]
    )
    assert code == 0
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert names == ["cmp-1-paged.json", "cmp-2-paged_block_size_32.json"]


def test_block_size_and_prefix_caching_flags_shape_the_policy(tmp_path):
    code = main(
        [
            "sim",
            *FAST,
            "--block-size",
            "32",
            "--enable-prefix-caching",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "r.json",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["policy"] == "paged:block_size=32,eviction=lru"
    assert summary["page_size"] == 32


def test_request_rate_and_time_scale_reach_the_trace(tmp_path):
    code = main(
        [
            "sim",
            *FAST,
            "--time-scale",
            "4",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "r.json",
        ]
    )
    assert code == 0
    assert json.loads((tmp_path / "r.json").read_text())["time_scale"] == 4.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset-path", "/no/such/trace.csv"], "/no/such/trace.csv"),
        (["--model", "llama-9"], "unknown model preset 'llama-9'"),
        (["--hardware", "tpu-v9"], "unknown hardware preset 'tpu-v9'"),
        (["--policy", "pagd"], "unknown kind 'pagd'"),
        (["--policy", "paged:eviction=magic"], "eviction='magic'"),
        (["--compare", "paged", "paged:blok=3"], "unknown key 'blok'"),
        (["--policy", "paged:block_size=32", "--block-size", "64"], "--block-size 64"),
        (["--num-prompts", "0"], "--num-prompts"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--max-model-len", "999999"], "--max-model-len"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--kv-cache-memory", "lots"], "--kv-cache-memory"),
        (["--kv-cache-memory", "1KiB"], "--kv-cache-memory"),
        (["--tensor-parallel-size", "3"], "--tensor-parallel-size 3"),
        (["--goodput", "ttft=5"], "--goodput"),
        (["--percentile-metrics", "ttft,speed"], "'speed'"),
        (["--dataset-name", "sharegpt"], "--dataset-path"),
        (["--random-input-len", "10"], "--dataset-name azure"),
    ],
)
def test_user_mistakes_exit_2_with_one_line_on_stderr(capsys, args, message):
    assert main(["sim", "--disable-tqdm", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kvlab sim: error: ")
    assert captured.err.count("\n") == 1
    assert message in captured.err


def test_a_malformed_trace_row_names_the_line_and_column(capsys, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,10,1\n"
        "2023-11-16 18:00:01.0,ten,1\n"
    )
    assert main(["sim", "--dataset-path", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kvlab sim: error: {path} line 3, column ContextTokens: 'ten' is not a whole number\n"
    )


def test_a_flag_of_the_wrong_type_is_an_argparse_error_not_a_traceback(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", "--num-prompts", "many"])
    assert exit_info.value.code == 2
    assert "--num-prompts: invalid int value: 'many'" in capsys.readouterr().err
