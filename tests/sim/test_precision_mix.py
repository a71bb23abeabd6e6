"""The precision mix over time: a demoting run's step table has, per step, the pages at each
level and the pages demoted into each (policies/precision/mix.py), and its summary's shares and
demotions are those columns summed; saved tables keep them, a plain run has none."""

from __future__ import annotations

import numpy as np
import pytest

from kvlab.metrics import summarize
from kvlab.metrics.results import save_results
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig, simulate
from kvlab.traces import load_trace

LEVELS = ("num_pages_at_level_0", "num_pages_at_level_1", "num_pages_at_level_2")
DEMOTIONS = ("num_demotions_to_level_1", "num_demotions_to_level_2")
SPARED = "num_spared_pages"
SAVED = "num_saved_context_tokens"
REQUANTIZED = "num_requantized_pages"


def _run(precision: str | None, num_prompts: int = 200, **memory: int):
    policy = "paged:eviction=lru" + (f",precision={precision}" if precision else "")
    config = SimConfig(model="llama-3.1-8b", hardware="h200-141g",
                       serving=ServingConfig.create(policy, enable_prefix_caching=True,
                                                    **memory))
    return simulate(load_trace("azure", num_prompts=num_prompts), config)


@pytest.fixture(scope="module")
def demoting():
    return _run("age:recent=64,depth=2")


def test_each_step_has_its_pages_at_each_level_and_its_demotions(demoting):
    columns = demoting.steps.columns
    assert demoting.steps.added_columns() == [*LEVELS, *DEMOTIONS, SPARED, SAVED, REQUANTIZED]
    for name in (*LEVELS, *DEMOTIONS, SPARED, SAVED, REQUANTIZED):
        assert len(columns[name]) == len(demoting.steps)
        assert min(columns[name]) >= 0, name
    pages = {name: np.asarray(columns[name]) for name in LEVELS}
    demoted = {name: np.asarray(columns[name]) for name in DEMOTIONS}
    # pages reach int4 only through fp8, and a level holds pages only once some were demoted
    assert demoted["num_demotions_to_level_2"].sum() <= demoted["num_demotions_to_level_1"].sum()
    first_fp8 = np.flatnonzero(pages["num_pages_at_level_1"])[0]
    assert np.flatnonzero(demoted["num_demotions_to_level_1"])[0] <= first_fp8
    # the mix moves over the run: most pages at the cache's dtype at first, not at the end
    held = sum(pages.values())
    assert pages["num_pages_at_level_0"][first_fp8 - 1] == held[first_fp8 - 1]
    assert (pages["num_pages_at_level_2"] > 0).sum() > len(held) // 2
    # the context the batch reads less: none before the first demotion, then some, never more
    # than the step's context
    saved, context = np.asarray(columns[SAVED]), np.asarray(columns["num_context_tokens"])
    assert not saved[:first_fp8].any() and (saved > 0).sum() > len(held) // 2
    assert (saved <= context).all()
    # requantizations where pages were demoted, each under a page's read and write (halved)
    requantized = np.asarray(columns[REQUANTIZED])
    demotions = sum(demoted.values())
    assert (requantized > 0).sum() > 0 and not requantized[demotions == 0].any()
    assert (requantized <= demotions).all()


def test_the_summary_is_its_columns_summed(demoting):
    summary = summarize(demoting)
    columns = {name: sum(demoting.steps.columns[name]) for name in (*LEVELS, *DEMOTIONS)}
    total = sum(columns[name] for name in LEVELS)
    names = summary["precision_levels"].split("/")
    for level, name in enumerate(names):
        assert summary[f"precision_share_{level}_{name}"] == columns[LEVELS[level]] / total
    for level, name in enumerate(names[1:], 1):
        assert summary[f"precision_demotions_{level}_{name}"] == columns[DEMOTIONS[level - 1]]
    assert summary["precision_demotions_per_s"] == pytest.approx(
        (columns[DEMOTIONS[0]] + columns[DEMOTIONS[1]]) / demoting.duration_s)


def test_kv_usage_is_the_bytes_held_pages_fill():
    """A demoting pool hands out more page ids than the device has pages of the cache's
    dtype (here 245 held of 128): KV usage is what held pages fill, demoted ones less than
    a page (the used pages less those spared), never above the device's bytes."""
    result = _run("age:recent=64,depth=2", num_prompts=60, kv_cache_memory_bytes=1 << 28)
    summary, total = summarize(result), result.num_total_pages
    used = np.asarray(result.steps.columns["num_used_pages"])
    filled = used - np.asarray(result.steps.columns[SPARED])
    assert used.max() > total
    assert summary["peak_kv_usage_perc"] == 100.0 * filled.max() / total <= 100.0
    weights = np.asarray(result.steps.columns["duration_s"])
    assert summary["mean_kv_usage_perc"] == pytest.approx(
        100.0 * (weights * filled).sum() / (weights.sum() * total))


def test_saved_step_tables_keep_the_mix(demoting, tmp_path):
    import pandas as pd

    save_results(summarize(demoting), demoting, result_dir=tmp_path, result_filename="run.json")
    table = pd.read_csv(tmp_path / "run.steps.csv")
    for name in (*LEVELS, *DEMOTIONS, SPARED):
        np.testing.assert_array_equal(table[name].to_numpy(), np.asarray(
            demoting.steps.columns[name]))


def test_a_run_without_demotion_adds_no_column():
    assert _run(None, num_prompts=20).steps.added_columns() == []


def test_one_level_adds_one_level_of_columns():
    steps = _run("age:recent=64,depth=1", num_prompts=60).steps
    assert steps.added_columns() == [*LEVELS[:2], DEMOTIONS[0], SPARED, SAVED, REQUANTIZED]


def test_a_clusters_mix_is_its_instances_together():
    """Two instances demoting: the cluster's summary has the KV Precision keys, its demotions
    the instances' added, its shares over every instance's steps."""
    from kvlab.sim import simulate_cluster

    config = SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=ServingConfig.create(
        "paged:eviction=lru,precision=age:recent=64,depth=2", enable_prefix_caching=True))
    result = simulate_cluster(load_trace("azure", num_prompts=120), config, num_instances=2)
    whole = summarize(result.cluster)
    parts = [summarize(run) for run in result.instances]
    for key in ("precision_demotions_1_fp8_e4m3", "precision_demotions_2_int4_per_token_head"):
        assert whole[key] == sum(part[key] for part in parts) > 0
    steps = [len(run.steps) for run in result.instances]
    held = [sum(sum(run.steps.columns[name]) for name in LEVELS) for run in result.instances]
    share = sum(h * part["precision_share_2_int4_per_token_head"]
                for h, part in zip(held, parts, strict=True)) / sum(held)
    assert whole["precision_share_2_int4_per_token_head"] == pytest.approx(share)
    assert len(result.cluster.steps) == sum(steps)
    assert whole["precision_levels"] == "auto/fp8_e4m3/int4_per_token_head"


def test_merged_runs_pool_their_mix():
    """`merge_runs` (pooled validation windows, bench runs): the mix over every run's steps,
    not the first run's; none where a run had none."""
    from kvlab.metrics import merge_runs

    first, second = _run("age:recent=64,depth=2", num_prompts=40), _run("age:recent=16,depth=2",
                                                                        num_prompts=60)
    merged = summarize(merge_runs([first, second]))
    parts = [summarize(first), summarize(second)]
    key = "precision_demotions_2_int4_per_token_head"
    assert merged[key] == parts[0][key] + parts[1][key] > parts[0][key]
    held = [sum(sum(run.steps.columns[name]) for name in LEVELS) for run in (first, second)]
    share = "precision_share_0_auto"
    assert merged[share] == pytest.approx(
        (held[0] * parts[0][share] + held[1] * parts[1][share]) / sum(held))
    plain = summarize(merge_runs([first, _run(None, num_prompts=20)]))
    assert not any(k.startswith("precision_") for k in plain)
