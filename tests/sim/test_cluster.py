"""Clusters of simulated instances: one instance is `simulate`, every router conserves requests
and pages, routing repeats for a seed, the fast path stays exact when any arrival may join any
instance, and the prefix-aware router finds the shared prefixes of a real trace."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.metrics import summarize
from kvlab.policies import StepLoop
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import TiersConfig, parse_tiers
from kvlab.sim import SimConfig, simulate, simulate_cluster, summarize_cluster
from kvlab.sim.cluster import Cluster, InstanceSpec
from kvlab.sim.cluster_result import cluster_request_table, cluster_step_table, instance_summaries
from kvlab.sim.router import router_names
from kvlab.traces import load_trace
from tests.sim.sim_workloads import make_trace, small_config


def outcome(request):
    return (request.request_id, request.status, request.first_scheduled_s,
            request.first_token_s, request.finish_s, request.num_output_tokens,
            request.num_preemptions, request.num_swaps_out, request.num_cached_tokens,
            request.error)


def outcomes(requests):
    return sorted(outcome(r) for r in requests)


def prefix_config(num_pages: int = 400) -> SimConfig:
    return SimConfig(serving=ServingConfig.create(
        "paged:eviction=lru", num_gpu_blocks_override=num_pages, enable_prefix_caching=True))


def mooncake(num_prompts: int = 120):
    return load_trace("mooncake", num_prompts=num_prompts, length_scale=8)


@pytest.mark.parametrize("router", router_names())
def test_one_instance_is_simulate(router):
    trace, config = mooncake(), prefix_config()
    alone = simulate(trace, config)
    cluster = simulate_cluster(trace, config, num_instances=1, router=router)
    assert outcomes(cluster.cluster.requests) == outcomes(alone.requests)
    for name, column in alone.steps.columns.items():
        np.testing.assert_array_equal(np.asarray(cluster.instances[0].steps.columns[name]),
                                      np.asarray(column), err_msg=name)
    np.testing.assert_array_equal(cluster.cluster.itls_s, alone.itls_s)
    summary, expected = summarize(cluster.cluster), summarize(alone)
    extra = {"num_instances": 1, "router": router, "router_seed": 0}
    assert summary == {**expected, **extra}


def test_an_arrival_at_a_step_end_joins_the_next_step_as_alone():
    """The arrival process may run after the step that ends at an arrival: the instance still
    routes and admits it first (the time rule, as `simulate`)."""
    config = small_config(num_pages=256)
    first = simulate(make_trace([(64, 40)]), config, decode_runs=False)
    starts = np.asarray(first.steps.columns["start_s"])
    durations = np.asarray(first.steps.columns["duration_s"])
    middle, end = starts[5] + durations[5] / 2, starts[5] + durations[5]
    trace = make_trace([(64, 40), (32, 4), (32, 4)], [0.0, middle, end])
    alone = simulate(trace, config)
    cluster = simulate_cluster(trace, config, num_instances=1)
    assert cluster.cluster.requests[2].first_scheduled_s == end
    assert outcomes(cluster.cluster.requests) == outcomes(alone.requests)


@settings(max_examples=30, deadline=None)
@given(
    router=st.sampled_from(router_names()),
    num_instances=st.integers(1, 4),
    policy=st.sampled_from(["paged", "paged:eviction=lru", "paged:preemption=swap",
                            "buddy:block_sizing=geometric"]),
    num_pages=st.integers(24, 200),
    lengths=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 60)), min_size=1,
                     max_size=30),
    gaps=st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.2]), min_size=30, max_size=30),
    seed=st.integers(0, 3),
)
def test_every_router_conserves_requests_and_pages(router, num_instances, policy, num_pages,
                                                   lengths, gaps, seed):
    """Every request finishes or fails with a reason on exactly one instance, and every
    instance gets all its pages back (the cluster asserts both)."""
    arrivals = np.cumsum(gaps[: len(lengths)]).tolist()
    # three groups of requests sharing their prompts' leading blocks
    groups = [tuple(1000 * (i % 3) + block for block in range(-(-input_len // 16)))
              for i, (input_len, _) in enumerate(lengths)]
    trace = make_trace(lengths, arrivals, hash_ids=groups)
    result = simulate_cluster(trace, small_config(policy, num_pages=num_pages,
                                                  enable_prefix_caching=True),
                              num_instances=num_instances, router=router, router_seed=seed)
    ids = sorted(r.request_id for run in result.instances for r in run.requests)
    assert ids == list(range(len(lengths)))
    assert all(result.instance_of[r.request_id] == index
               for index, run in enumerate(result.instances) for r in run.requests)
    assert all(r.is_finished and (r.finish_s is not None or r.error) for r in
               result.cluster.requests)


def assert_same_cluster_run(fast, stepped):
    assert fast.instance_of == stepped.instance_of
    assert outcomes(fast.cluster.requests) == outcomes(stepped.cluster.requests)
    for fast_run, stepped_run in zip(fast.instances, stepped.instances, strict=True):
        for name, column in stepped_run.steps.columns.items():
            np.testing.assert_array_equal(np.asarray(fast_run.steps.columns[name]),
                                          np.asarray(column), err_msg=name)
        np.testing.assert_array_equal(fast_run.itls_s, stepped_run.itls_s)


@pytest.mark.parametrize("router", router_names())
def test_decode_runs_give_the_stepped_records_in_a_cluster(router, monkeypatch):
    calls = []
    commit = StepLoop.commit_decode_run
    monkeypatch.setattr(StepLoop, "commit_decode_run",
                        lambda loop, s, *rest: calls.append(len(s)) or commit(loop, s, *rest))
    trace = load_trace("azure", num_prompts=240, time_scale=4.0)
    config = SimConfig(serving=ServingConfig.create("paged", enable_prefix_caching=True,
                                                    num_gpu_blocks_override=1500))
    fast = simulate_cluster(trace, config, num_instances=3, router=router, router_seed=5)
    assert sum(calls) > len(fast.cluster.steps) / 3  # the fast path was taken
    stepped = simulate_cluster(trace, config, num_instances=3, router=router, router_seed=5,
                               decode_runs=False)
    assert_same_cluster_run(fast, stepped)


@settings(max_examples=30, deadline=None)
@given(
    router=st.sampled_from(router_names()),
    num_instances=st.integers(2, 4),
    policy=st.sampled_from(["paged:eviction=lru", "paged:preemption=swap", "buddy"]),
    num_pages=st.integers(40, 300),
    lengths=st.lists(st.tuples(st.integers(1, 120), st.integers(2, 80)), min_size=2,
                     max_size=25),
    gaps=st.lists(st.sampled_from([0.0, 0.003, 0.02, 0.1]), min_size=25, max_size=25),
)
def test_decode_runs_are_exact_on_random_clusters(router, num_instances, policy, num_pages,
                                                  lengths, gaps):
    arrivals = np.cumsum(gaps[: len(lengths)]).tolist()
    groups = [tuple(1000 * (i % 2) + block for block in range(-(-input_len // 16)))
              for i, (input_len, _) in enumerate(lengths)]
    trace = make_trace(lengths, arrivals, hash_ids=groups)
    config = small_config(policy, num_pages=num_pages, enable_prefix_caching=True)
    runs = [simulate_cluster(trace, config, num_instances=num_instances, router=router,
                             router_seed=1, decode_runs=decode_runs)
            for decode_runs in (True, False)]
    assert_same_cluster_run(*runs)


def test_routing_repeats_for_a_seed_and_changes_with_it():
    trace, config = mooncake(), prefix_config()

    def routes(seed):
        return simulate_cluster(trace, config, num_instances=4, router="power-of-two",
                                router_seed=seed).instance_of

    assert routes(1) == routes(1)
    assert routes(1) != routes(2)


def test_round_robin_spreads_requests_evenly_in_arrival_order():
    result = simulate_cluster(mooncake(), prefix_config(), num_instances=4)
    assert [len(run.requests) for run in result.instances] == [30, 30, 30, 30]
    assert result.instance_of[5] == 1


def test_prefix_aware_beats_round_robin_on_prefix_hits_of_mooncake():
    """Four instances of a small cache each: the shared prefixes of the Mooncake excerpt hit
    only where their requests meet, which round-robin leaves to chance."""
    trace = load_trace("mooncake")
    config = SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=ServingConfig.create(
        "paged", enable_prefix_caching=True, num_gpu_blocks_override=25_000))
    rates = {router: summarize(simulate_cluster(trace, config, num_instances=4,
                                                router=router).cluster)
             ["prefix_cache_hit_rate_perc"] for router in ("round-robin", "prefix-aware")}
    assert rates["prefix-aware"] > 3 * rates["round-robin"] > 0


def test_the_summary_records_the_cluster_and_each_instance():
    result = simulate_cluster(mooncake(), prefix_config(), num_instances=3,
                              router="least-loaded")
    summary = summarize_cluster(result)
    assert (summary["num_instances"], summary["router"]) == (3, "least-loaded")
    assert [s["instance"] for s in summary["instances"]] == [0, 1, 2]
    assert sum(s["completed"] + s["failed"] for s in summary["instances"]) == 120
    assert sum(s["num_prompts"] for s in summary["instances"]) == summary["num_prompts"]
    assert summary["completed"] == sum(s["completed"] for s in summary["instances"])


def test_the_tables_name_each_row_s_instance():
    result = simulate_cluster(mooncake(), prefix_config(), num_instances=2)
    requests = cluster_request_table(result)
    assert list(requests.columns[:2]) == ["request_id", "instance"]
    assert (requests["instance"] == requests["request_id"].map(result.instance_of)).all()
    steps = cluster_step_table(result)
    assert steps["instance"].value_counts().sort_index().tolist() == [
        len(run.steps) for run in result.instances]


@pytest.mark.parametrize(("options", "parameter"), [
    ({"num_instances": 0}, "num_instances"),
    ({"router": "random"}, "router"),
    ({"router_seed": -1}, "router_seed"),
])
def test_bad_cluster_settings_name_the_setting(options, parameter):
    with pytest.raises(KvlabError) as info:
        simulate_cluster(mooncake(10), prefix_config(), **options)
    assert info.value.parameters == (parameter,)


def test_an_unknown_role_is_a_user_error():
    with pytest.raises(KvlabError, match="role"):
        InstanceSpec(prefix_config(), role="standby")


def test_prefill_instances_need_decode_instances_and_no_mixed_ones():
    for roles in (["prefill"], ["decode", "mixed"], ["prefill", "decode", "mixed"]):
        with pytest.raises(KvlabError, match="prefill and decode"):
            Cluster(mooncake(4), [InstanceSpec(prefix_config(), role) for role in roles])


def test_a_cluster_runs_once_with_its_parts_reachable():
    cluster = Cluster(mooncake(20), [InstanceSpec(prefix_config())] * 2)
    result = cluster.run()
    assert [len(i.requests) for i in cluster.instances] == [10, 10]
    assert result.num_instances == 2


def tier_config(tiers: str = "host:40GiB", **settings) -> SimConfig:
    serving = ServingConfig.create("paged", enable_prefix_caching=True,
                                   num_gpu_blocks_override=3000,
                                   kv_tiers=TiersConfig(parse_tiers(tiers), **settings))
    return SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=serving)


def test_one_instance_with_a_host_tier_is_simulate_under_prefix_aware_routing():
    """The router's lookups reach the tiers and change nothing there."""
    trace, config = load_trace("mooncake", num_prompts=200), tier_config()
    alone = simulate(trace, config)
    cluster = simulate_cluster(trace, config, num_instances=1, router="prefix-aware")
    assert outcomes(cluster.cluster.requests) == outcomes(alone.requests)
    expected = summarize(alone)
    assert expected["host_tier_hit_pages"] > 0
    assert summarize(cluster.cluster) == {**expected, "num_instances": 1,
                                          "router": "prefix-aware", "router_seed": 0}


def test_each_instance_has_its_own_tier_and_the_cluster_adds_them_up():
    trace = load_trace("mooncake", num_prompts=200)
    result = simulate_cluster(trace, tier_config(), num_instances=2, router="prefix-aware")
    summary = summarize_cluster(result)
    instances = summary["instances"]
    assert summary["host_tier_pages"] == 2 * 20480
    assert summary["host_tier_hit_pages"] == sum(s["host_tier_hit_pages"] for s in instances)
    assert summary["host_tier_hit_rate_perc"] > 0
    assert summary["device_prefix_hit_rate_perc"] + summary["host_tier_hit_rate_perc"] == \
        pytest.approx(summary["prefix_cache_hit_rate_perc"])
    fast_and_stepped = [simulate_cluster(trace, tier_config(), num_instances=2,
                                         router="prefix-aware", decode_runs=decode_runs)
                        for decode_runs in (True, False)]
    assert_same_cluster_run(*fast_and_stepped)


def test_the_remote_pool_is_one_for_the_whole_cluster():
    trace = load_trace("mooncake", num_prompts=200)
    cluster, summary = _pooled_run(trace, tier_config("remote:40GiB"))
    own = summarize(simulate_cluster(trace, tier_config("host:40GiB"), num_instances=3).cluster)
    # round-robin spreads a conversation over the instances: only a shared pool finds it again
    assert summary["remote_tier_hit_rate_perc"] > 2 * own["host_tier_hit_rate_perc"]
    assert summary["remote_tier_pages"] == cluster.instances[0].tiers[0].num_total_pages


def test_a_pool_of_tier_pages_of_several_device_pages_counts_device_pages():
    config = tier_config("remote:40GiB", write_policy="write-through", block_size=256)
    cluster, summary = _pooled_run(load_trace("mooncake", num_prompts=200), config)
    pool = cluster.instances[0].tiers[0]
    assert pool.block_pages == 16 and summary["remote_tier_hit_pages"] > 0
    # 40 GiB of 2 MiB device pages, in whole tier pages of 16
    assert summary["remote_tier_pages"] == pool.num_total_pages * 16 == 20480


def _pooled_run(trace, config: SimConfig) -> tuple[Cluster, dict]:
    """Three instances sharing `config`'s remote pool, run; the pool is one object, counted
    once, and each instance's share of its counters adds up to the pool's."""
    cluster = Cluster(trace, [InstanceSpec(config)] * 3)
    pools = {id(instance.tiers[0]) for instance in cluster.instances}
    assert len(pools) == 1  # one pool, reached by each instance over its own link
    result = cluster.run()  # run() checks every instance's pages
    summary = summarize(result.cluster)
    assert summary["remote_tier_stored_pages"] == cluster.instances[0].tiers[0].stats.num_stores
    # each instance reports its own share of the pool's counters, and the shares add up
    instances = instance_summaries(result)
    for counter in ("hit_pages", "stored_pages", "evicted_pages"):
        shares = [s[f"remote_tier_{counter}"] for s in instances]
        assert sum(shares) == summary[f"remote_tier_{counter}"]
        assert len(set(shares)) > 1 or not any(shares), counter  # not the pool's total thrice
    return cluster, summary
