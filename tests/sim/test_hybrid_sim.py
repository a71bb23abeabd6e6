"""Hybrid models in the simulator: the layout's KV-cache groups reach the manager (with the
retention interval and the raised block size), a run ends with every page back, the summary
shows pages per group, and what the hybrid manager refuses fails before any work."""

import pytest

from kvlab.cli import main
from kvlab.cli.report import format_report
from kvlab.errors import KvlabError
from kvlab.metrics import summarize
from kvlab.policies.hybrid_manager import HybridKVCacheManager
from kvlab.policies.manager import KVCacheManager
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import TiersConfig, parse_tiers
from kvlab.sim import SimConfig, Simulation
from kvlab.traces import load_trace


@pytest.fixture(scope="module")
def trace():
    return load_trace("random", num_prompts=60, request_rate=8.0, random_prefix_len=1024,
                      random_input_len=256, random_output_len=32, num_prefix_groups=3)


GROUP_SETTINGS = ("prefix_cache_retention_interval", "hybrid_kv_cache_manager")


def _config(**settings) -> SimConfig:
    serving = ServingConfig.create(settings.pop("policy", "paged"), enable_prefix_caching=True,
                                   kv_cache_memory_bytes=settings.pop("memory", 2**30),
                                   kv_tiers=settings.pop("kv_tiers", TiersConfig()),
                                   **{key: settings.pop(key) for key in list(settings)
                                      if key in GROUP_SETTINGS})
    return SimConfig(model=settings.pop("model", "gpt-oss-20b"), hardware="h100",
                     serving=serving, **settings)


def test_a_sliding_window_model_runs_end_to_end_with_every_page_back(trace):
    simulation = Simulation(trace, _config(prefix_cache_retention_interval=512))
    result = simulation.run()  # checks conservation: every page and slot came back
    assert isinstance(simulation.manager, HybridKVCacheManager)
    assert [g.label for g in simulation.manager.groups] == ["sliding_window(128)", "full"]
    assert all(r.finish_s is not None for r in result.requests)
    assert summarize(result)["prefix_cache_hit_rate_perc"] > 0


def test_the_retention_interval_reaches_the_manager(trace):
    manager = Simulation(trace, _config(prefix_cache_retention_interval=2048)).manager
    windowed = [m for m in manager.group_managers if hasattr(m, "retention_interval")]
    assert [m.retention_interval for m in windowed] == [2048]


def test_the_summary_shows_peak_and_mean_pages_per_group(trace):
    summary = summarize(Simulation(trace, _config()).run())
    assert summary["kv_cache_groups"] == ["sliding_window(128)", "full"]
    assert summary["prefix_cache_retention_interval"] is None  # (dense: every page cached)
    for index in (0, 1):
        peak = summary[f"kv_group_{index}_peak_pages"]
        assert peak >= summary[f"kv_group_{index}_mean_pages"] > 0
    # the window keeps far fewer pages than the full group
    assert summary["kv_group_0_peak_pages"] < summary["kv_group_1_peak_pages"]
    report = format_report(summary)
    assert "KV Cache Groups" in report
    assert "Group 0 sliding_window(128) peak pages:" in report


def test_a_plain_model_keeps_its_summary_keys(trace):
    config = _config(model="llama-2-7b")
    assert config.kv_cache_groups is None
    summary = summarize(Simulation(trace, config).run())
    assert not any(key.startswith(("kv_group_", "kv_cache_groups", "prefix_cache_retention",
                                   "hybrid_kv")) for key in summary)


def test_disabling_the_hybrid_manager_gives_the_plain_manager(trace):
    config = _config(hybrid_kv_cache_manager=False)
    assert config.kv_cache_groups is None
    simulation = Simulation(trace, config)
    assert type(simulation.manager) is KVCacheManager
    summary = summarize(simulation.run())
    assert summary["hybrid_kv_cache_manager"] is False
    assert "kv_group_0_peak_pages" not in summary


def test_a_linear_attention_model_runs_with_the_raised_block_size(trace):
    config = SimConfig(model="qwen3-next-80b-a3b", hardware="h200",
                       serving=ServingConfig.create("paged", enable_prefix_caching=True,
                                                    num_gpu_blocks_override=400))
    assert config.policy.block_size == config.capacity.page_size == 544
    simulation = Simulation(trace, config)
    assert simulation.manager.page_size == 544
    summary = summarize(simulation.run())
    assert summary["kv_cache_groups"] == ["state", "state", "state", "full"]


def test_a_host_tier_serves_hits_the_device_lost_on_a_sliding_window_model(trace):
    """With too little device memory to keep the shared prefixes, a host tier brings them back:
    pages of both groups (the window's too) loaded, every page and tier page conserved."""
    small = {"memory": 2**26}
    without = summarize(Simulation(trace, _config(**small)).run())
    simulation = Simulation(trace, _config(**small,
                                           kv_tiers=TiersConfig(parse_tiers("host:4GiB"))))
    tiered = summarize(simulation.run())
    simulation.manager.check_tiers()
    assert tiered["host_tier_hit_rate_perc"] > 0
    assert tiered["prefix_cache_hit_rate_perc"] > without["prefix_cache_hit_rate_perc"] + 10
    # a tier page holds one pool page: one group's share of the layers
    assert simulation.config.page_bytes == simulation.config.capacity.page_bytes


@pytest.mark.parametrize(("settings", "words"), [
    ({"prefix_cache_retention_interval": 100}, "multiple of the block size"),
    ({"prefix_cache_retention_interval": -16}, "expected None"),
    ({"kv_tiers": TiersConfig(parse_tiers("host:1GiB"), write_policy="write-through",
                              block_size=64)}, "kv_tier_block_size"),
])
def test_what_the_hybrid_manager_refuses_fails_on_construction(settings, words):
    with pytest.raises(KvlabError, match=words):
        _config(**settings)


def test_the_cli_flag_sets_the_interval_and_bad_values_name_it(capsys):
    args = ["sim", "--model", "gpt-oss-20b", "--hardware", "h100", "--enable-prefix-caching",
            "--dataset-name", "random", "--num-prompts", "20", "--disable-tqdm",
            "--kv-cache-memory", "1GiB"]
    assert main([*args, "--prefix-cache-retention-interval", "512"]) == 0
    out = capsys.readouterr().out
    assert "Prefix-cache retention interval:         512" in out
    assert main([*args, "--prefix-cache-retention-interval", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--prefix-cache-retention-interval is 100" in err
    assert main([*args, "--policy", "buddy:block_sizing=geometric"]) == 0  # (every family)
    assert "Group 1 full peak pages" in capsys.readouterr().out
    assert main([*args, "--policy", "paged:preemption=swap"]) == 0  # (swap works with groups)


def test_the_cli_accepts_disable_hybrid_kv_cache_manager(capsys):
    assert main(["sim", "--model", "gpt-oss-20b", "--hardware", "h100", "--dataset-name",
                 "random", "--num-prompts", "20", "--disable-tqdm", "--kv-cache-memory", "1GiB",
                 "--disable-hybrid-kv-cache-manager"]) == 0
    assert "KV Cache Groups" not in capsys.readouterr().out


def test_demotion_on_a_hybrid_model_is_one_line_naming_the_groups_and_the_way_out(capsys):
    args = ["sim", "--model", "gemma-3-27b", "--dataset-name", "random", "--num-prompts", "4",
            "--disable-tqdm", "--policy", "paged:eviction=lru,precision=age:recent=64"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "demotion needs one KV-cache group" in err and "gemma-3-27b' has 7" in err
    assert "--disable-hybrid-kv-cache-manager" in err
    assert main([*args, "--disable-hybrid-kv-cache-manager"]) == 0  # (one group: it demotes)
    assert "KV Precision" in capsys.readouterr().out
