"""Memory tiers in the simulator: hit rates against an independent trace-driven LRU, the links'
time on the step, conservation, and the flags' round trip through the result JSON."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest

from kvlab.metrics import summarize
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import TiersConfig, TierSpec, parse_tiers
from kvlab.sim import SimConfig, Simulation, simulate
from kvlab.sim.requests import to_requests
from kvlab.traces import Trace, TraceRequest, load_trace

PAGE = 16


def reference_lru_hit_rate(requests, capacity_pages: int, unit: int = 1) -> float:
    """Prompt tokens served from an LRU cache of `capacity_pages` pages, in percent: each
    request, in arrival order, hits its longest cached run of full prompt pages (leaving its
    last token), then every full prompt page becomes the most recently used. With `unit`
    pages an entry: runs of whole entries (each named by its last page's hash)."""
    cache: OrderedDict = OrderedDict()
    hit = total = 0
    for request in sorted(requests, key=lambda r: r.arrival_s):
        hashes = request.page_hashes(PAGE)[unit - 1 :: unit]
        limit = min(len(hashes), (request.prompt_len - 1) // PAGE // unit)
        run = 0
        while run < limit and hashes[run] in cache:
            run += 1
        hit += run * unit * PAGE
        total += request.prompt_len
        for key in hashes[: request.prompt_len // PAGE // unit]:
            cache[key] = None
            cache.move_to_end(key)
        while len(cache) > capacity_pages // unit:
            cache.popitem(last=False)
    return 100.0 * hit / total


def sequential_config(device_pages: int, tiers: TiersConfig) -> SimConfig:
    """One request at a time (so the order of lookups is the trace's), LRU everywhere."""
    serving = ServingConfig.create("paged", block_size=PAGE, enable_prefix_caching=True,
                                   num_gpu_blocks_override=device_pages, max_num_seqs=1,
                                   kv_tiers=tiers)
    return SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=serving)


def _hit_rate_and_reference(device_pages: int, tiers: TiersConfig, reference_pages: int,
                            unit: int = 1):
    trace = load_trace("mooncake", num_prompts=300)
    result = simulate(trace, sequential_config(device_pages, tiers))
    served = {r.request_id for r in result.requests if r.error is None}
    requests = [r for r in to_requests(trace) if r.request_id in served]
    return (summarize(result)["prefix_cache_hit_rate_perc"],
            reference_lru_hit_rate(requests, reference_pages, unit))


@pytest.mark.parametrize("host_pages", [3000, 20000])
def test_write_through_host_lru_hits_as_an_lru_of_its_size(host_pages):
    # Write-through puts every computed page in the host tier, so the host tier is the
    # cache: the device holds a subset of it.
    tiers = TiersConfig((TierSpec("host", size_pages=host_pages),), write_policy="write-through")
    simulated, reference = _hit_rate_and_reference(2000, tiers, host_pages)
    assert reference > 0.1
    assert simulated == pytest.approx(reference, abs=1.0)


@pytest.mark.parametrize("unit", [3, 16, 48])
def test_tier_pages_of_several_device_pages_hit_as_an_lru_of_such_pages(unit):
    # Write-through of whole tier pages (`block_size`, as vLLM's offloading and LMCache's
    # chunks): the host tier is an LRU of tier pages, hit in whole ones. (The trace shares
    # 512-token blocks, 32 pages: units of 3 and 48 pages lose part of them.)
    tiers = TiersConfig((TierSpec("host", size_pages=20000),), write_policy="write-through",
                        block_size=unit * PAGE)
    simulated, reference = _hit_rate_and_reference(2000, tiers, 20000, unit)
    assert reference > 0.1
    assert simulated == pytest.approx(reference, abs=1.0)


def test_write_back_host_lru_hits_as_an_lru_of_device_and_host():
    # Write-back keeps a page on the device until it is evicted there, then in the host
    # tier: together one LRU of both sizes, where the host tier is the larger.
    tiers = TiersConfig((TierSpec("host", size_pages=40000),))
    simulated, reference = _hit_rate_and_reference(4000, tiers, 44000)
    assert reference > 0.1
    assert simulated == pytest.approx(reference, abs=1.0)


def _mooncake_config(tiers: str, **settings) -> SimConfig:
    serving = ServingConfig.create("paged", enable_prefix_caching=True,
                                   kv_tiers=TiersConfig(parse_tiers(tiers), **settings))
    return SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=serving)


def test_a_host_tier_raises_the_hit_rate_and_every_page_comes_back():
    trace = load_trace("mooncake", num_prompts=200)
    without = summarize(simulate(trace, _mooncake_config("")))
    simulation = Simulation(trace, _mooncake_config("host:64GiB"))
    with_tier = summarize(simulation.run())  # run() checks every device and tier page
    assert with_tier["prefix_cache_hit_rate_perc"] > without["prefix_cache_hit_rate_perc"] + 1
    assert with_tier["host_tier_hit_pages"] > 0
    assert with_tier["host_tier_link_busy_s"] > 0
    assert simulation.tier_links.num_pages_loaded[0] == with_tier["host_tier_hit_pages"]


def test_loads_cost_step_time_unless_they_overlap_the_forward_pass():
    trace = load_trace("mooncake", num_prompts=200)
    slow = _mooncake_config("ssd:500GiB:read=0.5")  # a slow link: loads dominate
    waited = summarize(simulate(trace, slow))
    overlapped = summarize(simulate(trace, _mooncake_config("ssd:500GiB:read=0.5",
                                                            overlap="layerwise")))
    assert waited["ssd_tier_hit_pages"] > 0
    assert overlapped["mean_ttft_ms"] < waited["mean_ttft_ms"]


@pytest.mark.parametrize("block_size", [None, 64])
def test_decode_runs_give_the_same_run_with_tiers(block_size):
    trace = load_trace("mooncake", num_prompts=120, length_scale=8)
    config = _mooncake_config("host:4GiB,ssd:16GiB:eviction=arc", write_policy="write-through",
                              block_size=block_size)
    fast = summarize(simulate(trace, config))
    stepped = summarize(simulate(trace, config, decode_runs=False))
    assert fast == stepped


@pytest.mark.parametrize("settings", [{"store_threshold": 1},
                                      {"write_policy": "write-through", "block_size": 256}])
def test_the_tiers_round_trip_through_the_result_json(settings):
    config = _mooncake_config("host:64GiB,ssd:1TiB:eviction=lfu:read=6", **settings)
    trace = load_trace("mooncake", num_prompts=20)
    summary = summarize(simulate(trace, config))
    saved = json.loads(json.dumps(summary))
    # (the run's tier page size as it ran: `auto` settled for the trace)
    assert TiersConfig.from_json(saved["kv_tiers"]) \
        == config.with_tier_pages_for(trace).serving.kv_tiers
    assert ServingConfig.from_json(config.serving.to_json()) == config.serving


def test_a_host_tier_larger_than_the_hosts_memory_is_warned_about():
    assert _mooncake_config("host:1TiB").tier_warnings()
    assert not _mooncake_config("host:64GiB").tier_warnings()


MOONCAKE = ["sim", "--dataset-name", "mooncake", "--num-prompts", "60", "--model", "llama-3.1-8b",
            "--hardware", "h200-141g", "--disable-tqdm"]


def test_kvlab_sim_reports_and_saves_the_tiers(capsys, tmp_path):
    from kvlab.cli import main

    code = main([*MOONCAKE, "--kv-tiers", "host:64GiB,ssd:1TiB:eviction=arc",
                 "--kv-tier-write", "write-through", "--save-result", "--result-dir",
                 str(tmp_path), "--result-filename", "tiers.json"])
    assert code == 0
    out = capsys.readouterr().out
    assert "KV Tiers" in out and "Host tier hit rate (%):" in out and "SSD tier pages:" in out
    saved = json.loads((tmp_path / "tiers.json").read_text())
    assert saved["kv_tiers"] == {"tiers": "host:68719476736,ssd:1099511627776:eviction=arc",
                                 "write_policy": "write-through", "store_threshold": 0,
                                 "overlap": "none", "block_size": 512}  # (auto, settled)
    assert saved["enable_prefix_caching"] is True  # tiers turn prefix caching on
    assert saved["host_tier_pages"] == 64 * 2**30 // (16 * 128 * 2**10)


@pytest.mark.parametrize("flags, words", [
    (["--kv-tiers", "disk:1GiB"], "--kv-tiers: tier kind 'disk'"),
    (["--kv-tiers", "host:1GiB", "--kv-tier-store-threshold", "-1"],
     "--kv-tier-store-threshold -1: expected a whole number >= 0"),
    (["--kv-tiers", "host:1KiB"], "holds no page"),
    (["--kv-tiers", "host:1GiB", "--kv-tier-write", "write-through", "--kv-tier-block-size",
      "24"], "--kv-tier-block-size 24: expected a multiple of the page size (16 tokens)"),
    (["--kv-tiers", "host:16MiB", "--kv-tier-write", "write-through", "--kv-tier-block-size",
      "256"], "holds no tier page of 16"),
])
def test_bad_tier_flags_name_the_flag(capsys, flags, words):
    from kvlab.cli import main

    assert main([*MOONCAKE, *flags]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(("page_size", "hash_block", "tokens"), [
    (16, 512, 512), (16, 16, None), (16, 96, 96), (16, 100, None), (128, 1024, 512),
    (16, 1024, 512), (16, 768, 384), (512, 1024, None), (16, None, None)])
def test_auto_tier_pages_are_the_largest_up_to_512_tokens_inside_a_hash_block(
        page_size, hash_block, tokens):
    config = TiersConfig(parse_tiers("host:4GiB"))
    assert config.block_size == "auto" and config.block_pages(page_size) == 1  # (unsettled)
    assert config.for_prefix_blocks(page_size, hash_block).block_size == tokens
    fixed = TiersConfig(parse_tiers("host:4GiB"), block_size=64)
    assert fixed.for_prefix_blocks(page_size, hash_block) is fixed


def test_auto_tier_pages_follow_the_traces_prefix_keys():
    mooncake = load_trace("mooncake", num_prompts=20)
    assert mooncake.prefix_block_size() == 512
    config = _mooncake_config("host:64GiB")
    assert config.with_tier_pages_for(mooncake).serving.kv_tiers.block_size == 512
    tokens = Trace("ids", "random", "synthetic", [
        TraceRequest(0, 0.0, 32, 4, prompt_token_ids=tuple(range(32)))])
    assert tokens.prefix_block_size() is None
    assert config.with_tier_pages_for(tokens).serving.kv_tiers.block_size is None
    untiered = _mooncake_config("")
    assert untiered.with_tier_pages_for(mooncake) is untiered
    # a hybrid model's tier pages hold one device page (its groups' pages are kept apart)
    serving = ServingConfig.create("paged", enable_prefix_caching=True,
                                   kv_tiers=TiersConfig(parse_tiers("host:4GiB")))
    hybrid = SimConfig(model="gemma-3-27b", hardware="h200-141g", serving=serving)
    assert hybrid.with_tier_pages_for(mooncake).serving.kv_tiers.block_size is None


@pytest.mark.parametrize(("value", "expected"), [("auto", 512), ("none", None), ("64", 64)])
def test_the_tier_page_flag_takes_tokens_auto_or_none(capsys, tmp_path, value, expected):
    from kvlab.cli import main

    code = main([*MOONCAKE, "--num-prompts", "5", "--kv-tiers", "host:64GiB",
                 "--kv-tier-block-size", value, "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", "tiers.json"])
    assert code == 0
    saved = json.loads((tmp_path / "tiers.json").read_text())
    assert saved["kv_tiers"]["block_size"] == expected


def test_a_bad_tier_page_flag_says_what_was_expected(capsys):
    from kvlab.cli import main

    with pytest.raises(SystemExit) as exit_info:  # (argparse's exit for a bad flag)
        main([*MOONCAKE, "--kv-tiers", "host:64GiB", "--kv-tier-block-size", "big"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--kv-tier-block-size: expected a number of tokens, auto or none, not 'big'" in err
