"""`kvlab tune --quality ACCURACY.json --max-kl X`: each candidate's KV precision (its
kv_cache_dtype and its policy's precision=) looked up in kvlab accuracy's JSON; candidates over
the budget are not simulated and rank last, the others by their highest rate (issue 48)."""

import json

import pandas as pd
import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.sweep.quality import QualityBudget, QualityTable, judge

# figures of the shape kvlab accuracy --json writes (made up: the mechanics only)
ACCURACY = {"model": "stdlib-llama", "corpus": "held-out", "results": [
    {"kv_cache_dtype": "fp8_e4m3", "precision": "none", "kl_mean": 3e-3, "kl_p99": 2e-2,
     "top1_agreement": 0.95, "perplexity_change": 0.09},
    {"kv_cache_dtype": "auto", "precision": "age:depth=1,recent=32", "kl_mean": 4e-4,
     "kl_p99": 3e-3, "top1_agreement": 0.98, "perplexity_change": 0.025},
    {"kv_cache_dtype": "auto", "precision": "age:recent=128", "kl_mean": 1e-4,
     "kl_p99": 7e-4, "top1_agreement": 0.99, "perplexity_change": 0.011},
]}
POLICIES = ["paged:eviction=lru", "paged:eviction=lru,precision=age:recent=32",
            "paged:eviction=lru,precision=age:recent=128,depth=1"]


@pytest.fixture
def accuracy_file(tmp_path):
    path = tmp_path / "accuracy.json"
    path.write_text(json.dumps(ACCURACY))
    return path


def test_each_candidate_gets_its_precisions_row_and_the_budget_says_which_pass(accuracy_file):
    table = QualityTable.load(accuracy_file)
    candidates = [{"policy": p} for p in POLICIES] + [{"kv_cache_dtype": "fp8"}]
    notes, over = judge(candidates, table, QualityBudget(max_kl=2e-4))
    assert [n["kl_mean"] for n in notes] == [0.0, 4e-4, 1e-4, 3e-3]  # auto: the reference
    assert over[0] is None and over[2] is None
    assert over[1] == "KL 4.00e-04 > 0.0002" and over[3].startswith("KL 3.00e-03")
    _, over = judge(candidates, table, QualityBudget(min_top1=0.985))
    assert [o is None for o in over] == [True, False, True, False]
    _, over = judge(candidates, table, QualityBudget(max_perplexity_increase=0.05))
    assert over == [None, None, None, "perplexity +0.0900 > +0.05"]


def test_a_candidate_the_file_lacks_names_what_to_measure(accuracy_file):
    with pytest.raises(KvlabError, match=r"no row for kv_cache_dtype=auto, precision=age:"
                       r"recent=64.*kvlab accuracy stdlib-llama --precision age:recent=64"):
        QualityTable.load(accuracy_file).of({"policy": "paged:precision=age:recent=64"})


def test_a_candidate_s_precision_key_wins_over_its_policy_s(accuracy_file):
    """A sweep that varies the policy key `precision` gives it beside the policy text."""
    row = QualityTable.load(accuracy_file).of({"policy": "paged:eviction=lru",
                                              "precision": "age:recent=128"})
    assert row["kl_mean"] == 1e-4


def test_kvlab_tune_ranks_within_the_budget_and_lists_the_rest_unsimulated(
        tmp_path, accuracy_file, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("grid:\n  policy:\n" + "".join(f"    - '{p}'\n" for p in POLICIES))
    out = tmp_path / "tuned"
    assert main(["tune", str(sweep), "--slo", "ttft:2000", "--num-prompts", "40",
                 "--kv-cache-memory", "4GiB", "--start-rate", "4", "--rate-tolerance", "0.3",
                 "--max-rate", "64", "--quality", str(accuracy_file), "--max-kl", "2e-4",
                 "-o", str(out), "--workers", "1", "--disable-tqdm"]) == 0
    printed = capsys.readouterr().out
    assert "Quality of each KV precision" in printed and "kl_mean" in printed
    saved = pd.read_parquet(out / "tune.parquet")
    last = saved.iloc[-1]
    assert last["param.policy"] == POLICIES[1] and last["num_probes"] == 0
    assert last["status"] == "over budget: KL 4.00e-04 > 0.0002"
    assert list(saved["status"][:2]) == ["ok", "ok"]
    assert list(saved["kl_mean"][:2].sort_values()) == [0.0, 1e-4]
    probes = pd.read_parquet(out / "probes")
    assert POLICIES[1] not in set(probes["param.policy"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-kl", "1e-3"], "--max-kl, --max-perplexity-increase and --min-top1 need --quality"),
    (["--quality", "nope.json"], "--quality nope.json: cannot read it"),
    (["--quality", "{bad}", "--max-kl", "-1"], "--max-kl -1.0: expected a finite number >= 0"),
])
def test_bad_quality_input_is_one_line(tmp_path, capsys, argv, message, accuracy_file):
    argv = [str(accuracy_file) if a == "{bad}" else a for a in argv]
    assert main(["tune", "--slo", "ttft:100", *argv, "-o", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_file_that_is_not_an_accuracy_json_is_one_line(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"results": [{"kv_cache_dtype": "fp8"}]}))
    assert main(["tune", "--slo", "ttft:100", "--quality", str(other), "-o",
                 str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "expected the JSON of kvlab accuracy --json" in err and err.count("\n") == 1
