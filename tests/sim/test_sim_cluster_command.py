"""`kvlab sim --num-instances N --router NAME`: the cluster's report and instance table, its
result files, one instance as today, and the flags' errors."""

import json

import pandas as pd
import pytest

from kvlab.cli import main

FAST = ["--num-prompts", "120", "--disable-tqdm"]
MOONCAKE = ["--dataset-name", "mooncake", "--length-scale", "8", "--enable-prefix-caching",
            "--num-gpu-blocks-override", "400"]


def test_one_instance_prints_exactly_the_report_of_no_cluster_flags(capsys):
    assert main(["sim", *FAST]) == 0
    alone = capsys.readouterr().out
    assert main(["sim", *FAST, "--num-instances", "1", "--router", "power-of-two"]) == 0
    assert capsys.readouterr().out == alone


def test_a_cluster_prints_the_whole_report_then_one_row_per_instance(capsys):
    assert main(["sim", *FAST, *MOONCAKE, "--num-instances", "3",
                 "--router", "least-loaded"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].endswith("(each of 3 instances)")
    assert "Serving Benchmark Result" in out and "Per Instance" in out
    assert any(line.split() == ["Instances:", "3"] for line in lines)
    assert any(line.split() == ["Router:", "least-loaded"] for line in lines)
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("instance"))
    rows = [line.split() for line in lines[header + 2: header + 5]]
    assert [row[:2] for row in rows] == [["0", "mixed"], ["1", "mixed"], ["2", "mixed"]]
    assert sum(int(row[2]) for row in rows) == 120
    completed = next(line for line in lines if line.startswith("Successful requests:"))
    assert int(completed.split()[-1]) <= 120


def test_the_saved_cluster_summary_round_trips_with_its_instances(tmp_path, capsys):
    args = ["sim", *FAST, *MOONCAKE, "--num-instances", "2", "--router", "prefix-aware",
            "--router-seed", "3", "--save-result", "--result-dir", str(tmp_path),
            "--result-filename", "cluster.json"]
    assert main(args) == 0
    saved = json.loads((tmp_path / "cluster.json").read_text())
    assert (saved["num_instances"], saved["router"], saved["router_seed"]) == (
        2, "prefix-aware", 3)
    instances = saved["instances"]
    assert [s["instance"] for s in instances] == [0, 1]
    assert sum(s["num_prompts"] for s in instances) == saved["num_prompts"] == 120
    assert saved["completed"] == sum(s["completed"] for s in instances)
    requests = pd.read_csv(tmp_path / "cluster.requests.csv")
    assert list(requests.columns[:2]) == ["request_id", "instance"]
    assert requests.groupby("instance").size().tolist() == [s["num_prompts"] for s in instances]
    steps = pd.read_csv(tmp_path / "cluster.steps.csv")
    assert steps.columns[0] == "instance" and set(steps["instance"]) == {0, 1}


def test_compared_policies_each_run_as_a_cluster(tmp_path, capsys):
    assert main(["sim", *FAST, *MOONCAKE, "--num-instances", "2", "--compare", "paged",
                 "paged:eviction=fifo", "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", "c.json"]) == 0
    out = capsys.readouterr().out
    assert "Policy Comparison" in out
    assert "[1] Per Instance" in out and "[2] Per Instance" in out
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "c-1-paged_eviction_lru.json", "c-2-paged_eviction_fifo.json"]


@pytest.mark.parametrize(("args", "message"), [
    (["--num-instances", "0"], "--num-instances is 0; expected a whole number >= 1"),
    (["--router", "random"], "--router is 'random'; expected one of round-robin, least-loaded, "
                             "prefix-aware, power-of-two"),
    (["--num-instances", "2", "--router-seed", "-1"], "--router-seed is -1"),
    (["--pd", "1"], "--pd '1': expected P:D"),
])
def test_bad_cluster_flags_exit_2_naming_the_flag(capsys, args, message):
    assert main(["sim", *FAST, *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert not captured.out  # before any work
