"""vLLM V1's defaults are kvlab's (`--preset vllm`), vLLM V0's a named preset (`vllm-v0`)
that fills only what the policy spec and the flags leave unset; sim says that V1 never swaps."""

from __future__ import annotations

import pytest

from kvlab.cli import main
from kvlab.errors import KvlabError
from kvlab.policies import PolicySpec
from kvlab.policies.serving import ServingConfig
from kvlab.policies.serving_presets import serving_preset
from kvlab.sweep.runner import serving_config


def test_the_library_defaults_are_vllm_v1s():
    policy, serving = PolicySpec(), ServingConfig()
    assert (policy.preemption, policy.victim, policy.watermark) == (
        "recompute", "last-admitted", 0.0)
    assert serving.scheduler_reserve_full_isl is True


def test_the_v0_preset_fills_the_unset_keys_and_settings():
    serving = serving_config({"policy": "paged", "preset": "vllm-v0"})
    assert (serving.policy.victim, serving.policy.watermark) == ("last-arrived", 0.01)
    assert serving.scheduler_reserve_full_isl is False


def test_what_the_user_names_wins_over_the_preset():
    serving = serving_config({"policy": "paged:watermark=0.05", "victim": "longest",
                              "preset": "vllm-v0", "scheduler_reserve_full_isl": True})
    assert (serving.policy.victim, serving.policy.watermark) == ("longest", 0.05)
    assert serving.scheduler_reserve_full_isl is True


def test_the_vllm_preset_is_the_default():
    assert serving_config({"policy": "paged"}) == serving_config(
        {"policy": "paged", "preset": "vllm"}) == ServingConfig()


def test_an_unknown_preset_names_the_choices():
    with pytest.raises(KvlabError, match="vllm, vllm-v0"):
        serving_preset("v2")


def _policy_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("Policy:")).split()[-1]


def test_sim_takes_the_preset_and_prints_the_policy_it_ran(capsys):
    assert main(["sim", "--num-prompts", "50", "--disable-tqdm"]) == 0
    assert _policy_line(capsys.readouterr().out) == "paged"
    assert main(["sim", "--num-prompts", "50", "--disable-tqdm", "--preset", "vllm-v0"]) == 0
    assert _policy_line(capsys.readouterr().out) == "paged:victim=last-arrived,watermark=0.01"


def test_sim_with_swap_says_vllm_v1_never_swaps(capsys):
    code = main(["sim", "--num-prompts", "20", "--disable-tqdm", "--policy",
                 "paged:preemption=swap"])
    assert code == 0
    assert "vLLM V1 never swaps" in capsys.readouterr().err


def test_a_sweep_grid_over_the_preset(tmp_path, capsys):
    out = tmp_path / "presets.parquet"
    code = main(["sweep", "--num-prompts", "30", "--grid", "preset=vllm,vllm-v0",
                 "-o", str(out), "--disable-tqdm"])
    assert code == 0, capsys.readouterr().err
    import pandas as pd

    rows = pd.read_parquet(out)
    assert sorted(rows["policy"]) == ["paged", "paged:victim=last-arrived,watermark=0.01"]
