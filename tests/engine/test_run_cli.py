"""`kvlab run`: the bundled trace through the real engine, the report and the result files."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvlab.cli import main
from kvlab.metrics import STEP_COLUMNS

# The first four requests of the bundled Azure conversation excerpt need 418, 505, 934 and 107
# tokens: with --max-model-len 512 the third fails and the others run.
SMALL = ["--num-prompts", "4", "--max-model-len", "512", "--kv-cache-memory", "8MiB"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_run_saves_the_summary_the_requests_and_the_step_profile(tmp_path, capsys):
    code = main(
        [
            "run",
            *SMALL,
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "run.json",
            "--disable-tqdm",
        ]
    )
    assert code == 0
    out = capsys.readouterr()
    assert "CPU KV cache size: 8,192 tokens, Maximum concurrency" in out.out
    assert "Serving Benchmark Result" in out.out and "engine:cpu" in out.out
    assert "1 request(s) failed" in out.err and "max_model_len 512" in out.err
    summary = json.loads((tmp_path / "run.json").read_text())
    assert (summary["completed"], summary["failed"]) == (3, 1)
    assert summary["total_output_tokens"] == 44 + 109 + 16
    assert summary["model"] == "tiny-llama" and summary["replay"] == "fast"
    requests = pd.read_csv(tmp_path / "run.requests.csv")
    assert requests["status"].tolist().count("finished_error") == 1
    steps = pd.read_csv(tmp_path / "run.steps.csv")
    assert list(steps.columns) == list(STEP_COLUMNS) and len(steps) > 0
    assert (steps["wall_time_s"] > 0).all()


def test_block_size_contradicting_the_policy_is_refused(capsys):
    code = main(["run", *SMALL, "--policy", "paged:block_size=8", "--block-size", "32"])
    assert code == 2
    assert "--block-size 32 contradicts" in capsys.readouterr().err


def test_a_bad_kv_cache_size_is_a_one_line_error(capsys):
    code = main(["run", "--kv-cache-memory", "lots"])
    assert code == 2
    assert "--kv-cache-memory 'lots'" in capsys.readouterr().err


def test_an_unknown_model_names_the_presets(capsys):
    code = main(["run", *SMALL, "--model", "no-such-model"])
    assert code == 2
    assert "tiny-llama" in capsys.readouterr().err
