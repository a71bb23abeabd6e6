"""`kvlab tune --slo-class`: candidates ranked by one SLO class's goodput, the attainment
counted over that class's requests only."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.sweep import SearchOptions, SerialExecutor, tune
from kvlab.sweep.runner import run_point

SPEC = Path(__file__).resolve().parents[2] / "docs/experiments/scheduling/two-class.yaml"
BASE = {"dataset_name": "workload", "dataset_path": str(SPEC), "num_prompts": 80,
        "model": "llama-3.1-8b", "num_gpu_blocks_override": 1500,
        "enable_prefix_caching": True}
SLOS = {"ttft": 1000.0}


def test_the_attainment_counts_the_class_only():
    chat = run_point({**BASE, "request_rate": 4.0, "goodput": SLOS, "slo_class": "chat"})
    every = run_point({**BASE, "request_rate": 4.0, "goodput": SLOS})
    assert chat["status"] == every["status"] == "ok"
    shares = {name: chat[f"classes.{name}.goodput_perc"] for name in ("chat", "batch")}
    assert chat["slo_attainment"] == pytest.approx(shares["chat"] / 100)
    assert chat["slo_attainment"] != every["slo_attainment"]
    missing = run_point({**BASE, "request_rate": 4.0, "goodput": SLOS, "slo_class": "vip"})
    assert missing["status"] == "error" and "classes: batch, chat" in missing["error"]


def test_tune_ranks_scheduling_policies_by_a_class_goodput():
    candidates = [{**BASE, "scheduling_policy": order} for order in ("fcfs", "priority")]
    table = tune(candidates, SLOS, SerialExecutor(), slo_class="chat",
                 options=SearchOptions(start_rate=2.0, rate_tolerance=0.25, max_rate=64))
    assert list(table["param.scheduling_policy"]) == ["priority", "fcfs"]
    assert table["max_request_rate"].iloc[0] > table["max_request_rate"].iloc[1]


def test_kvlab_tune_names_the_class(tmp_path, capsys):
    argv = ["tune", "--slo", "ttft:1000", "--slo-class", "chat", "--dataset-name", "workload",
            "--dataset-path", str(SPEC), "--num-prompts", "40", "--model", "llama-3.1-8b",
            "--start-rate", "4", "--rate-tolerance", "0.5", "--max-rate", "16",
            "-o", str(tmp_path / "t"), "--disable-tqdm"]
    assert main(argv) == 0
    assert "of chat requests meeting ttft <= 1000 ms" in capsys.readouterr().out
    with pytest.raises(KvlabError):
        tune([BASE], {}, SerialExecutor(), slo_class="chat")
