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


def test_run_with_demotion_reports_the_precision_mix_the_simulator_reports(tmp_path, capsys):
    """`kvlab run --policy paged:...,precision=age:...` requantizes in the engine and prints
    and saves the precision mix; all requests arrive at once, so the schedule, hence the
    demotions and the shares at each level, are the simulator's on the same trace."""
    args = ["--model", "tiny-llama", "--dataset-name", "random", "--num-prompts", "8",
            "--random-input-len", "64", "--random-output-len", "32",
            "--policy", "paged:block_size=16,precision=age:recent=16,depth=2",
            "--num-gpu-blocks-override", "24", "--save-result", "--result-dir", str(tmp_path)]
    saved = {}
    for command in ("run", "sim"):
        code = main([command, *args, "--result-filename", f"{command}.json", "--disable-tqdm"])
        assert code == 0
        assert "KV Precision" in capsys.readouterr().out
        saved[command] = json.loads((tmp_path / f"{command}.json").read_text())
    mix = {key: value for key, value in saved["run"].items()
           if key.startswith(("precision_share", "precision_demotions_"))
           and key != "precision_demotions_per_s"}  # (per second: wall time against simulated)
    assert mix["precision_demotions_1_fp8_e4m3"] > 0
    assert mix["precision_demotions_2_int4_per_token_head"] > 0
    assert sum(v for k, v in mix.items() if "share" in k) == pytest.approx(1.0)
    assert mix == {key: saved["sim"][key] for key in mix}
    # and step by step: the pages at each level and the demotions of every step
    steps = {command: pd.read_csv(tmp_path / f"{command}.steps.csv") for command in saved}
    columns = [name for name in steps["sim"] if name.startswith(("num_pages_at_level_",
                                                                 "num_demotions_to_level_"))]
    assert len(columns) == 5 and steps["run"]["num_demotions_to_level_2"].sum() > 0
    pd.testing.assert_frame_equal(steps["run"][columns], steps["sim"][columns])


def test_a_precision_setting_that_cannot_act_is_named(capsys):
    assert main(["run", "--num-prompts", "1", "--max-model-len", "512", "--kv-cache-memory",
                 "8MiB", "--disable-tqdm", "--policy",
                 "paged:precision=age:recent=64,cached=0,recompute=1"]) == 0
    assert ("precision recompute=1: acts on prefix-cache pages, and prefix caching is off"
            in capsys.readouterr().err)

