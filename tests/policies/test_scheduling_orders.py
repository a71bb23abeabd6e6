"""Each scheduling order on a small queue: who is admitted first, who is preempted, and the
spec errors a user sees."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.policies import KVCacheManager, Request, Scheduler, SchedulerConfig
from kvlab.policies.scheduling.spec import canonical_scheduling_policy, make_order
from kvlab.policies.serving import ServingConfig


def _scheduler(order: str, *, num_pages: int = 64, max_num_seqs: int = 1,
               eviction: str = "lru", block_size: int = 4) -> Scheduler:
    manager = KVCacheManager(f"paged:block_size={block_size},eviction={eviction}", num_pages,
                             max_model_len=256)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256,
                             max_model_len=256, scheduling_policy=order)
    return Scheduler(config, manager)


def _run_to_end(scheduler: Scheduler, now: float = 0.0) -> float:
    while scheduler.has_unfinished():
        output = scheduler.schedule(now)
        now += 0.01
        scheduler.update(output, None, now)
    return now


def _first_admitted(scheduler: Scheduler, requests: list[Request], now: float = 0.0) -> int:
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule(now)
    return output.requests[0].request_id


def test_fcfs_admits_in_arrival_order():
    scheduler = _scheduler("fcfs")
    requests = [Request(0, 40, 2, arrival_s=0.0), Request(1, 8, 2, arrival_s=0.1,
                                                           priority=-5)]
    assert _first_admitted(scheduler, requests) == 0


def test_priority_admits_the_lowest_value_first_then_the_earliest():
    scheduler = _scheduler("priority")
    requests = [Request(0, 8, 2, arrival_s=0.0, priority=2),
                Request(1, 8, 2, arrival_s=0.1, priority=1),
                Request(2, 8, 2, arrival_s=0.2, priority=1)]
    assert _first_admitted(scheduler, requests) == 1


def test_priority_preempts_the_lowest_priority_running_request_as_vllm():
    # 12 pages of 4 tokens: three requests of 12 prompt tokens fit (9 pages) and then grow
    # until one must go: vLLM's victim is max(running, key=(priority, arrival)), here the
    # earliest arrival because it has the largest priority value
    scheduler = _scheduler("priority", num_pages=12, max_num_seqs=3, eviction="none")
    requests = [Request(0, 12, 20, arrival_s=0.0, priority=5),
                Request(1, 12, 20, arrival_s=0.1, priority=0),
                Request(2, 12, 20, arrival_s=0.2, priority=1)]
    for request in requests:
        scheduler.add_request(request)
    now = 0.0
    victims = []
    while scheduler.has_unfinished():
        output = scheduler.schedule(now)
        victims += [r.request_id for r in output.preempted]
        now += 0.01
        scheduler.update(output, None, now)
    assert victims and victims[0] == 0
    fcfs = _scheduler("fcfs", num_pages=12, max_num_seqs=3, eviction="none")
    again = [Request(r.request_id, 12, 20, arrival_s=r.arrival_s, priority=r.priority)
             for r in requests]
    for request in again:
        fcfs.add_request(request)
    while not any(r.num_preemptions for r in again):
        output = fcfs.schedule(now)
        now += 0.01
        fcfs.update(output, None, now)
    assert [r.request_id for r in again if r.num_preemptions] == [2]  # last-arrived


def test_sjf_admits_the_shortest_prompt_and_the_oracle_the_shortest_total():
    requests = [Request(0, 30, 2, arrival_s=0.0), Request(1, 10, 60, arrival_s=0.1),
                Request(2, 20, 4, arrival_s=0.2)]
    assert _first_admitted(_scheduler("sjf"), requests) == 1
    fresh = [Request(r.request_id, r.prompt_len, r.max_output_tokens, arrival_s=r.arrival_s)
             for r in requests]
    assert _first_admitted(_scheduler("sjf-oracle"), fresh) == 2


def test_the_starvation_guard_serves_a_request_waiting_too_long_first():
    requests = [Request(0, 30, 2, arrival_s=0.0), Request(1, 10, 2, arrival_s=5.0)]
    assert _first_admitted(_scheduler("sjf:max_wait_s=1"), requests, now=5.0) == 0
    fresh = [Request(0, 30, 2, arrival_s=0.0), Request(1, 10, 2, arrival_s=5.0)]
    assert _first_admitted(_scheduler("sjf:max_wait_s=10"), fresh, now=5.0) == 1


def _cache_prefix(scheduler: Scheduler, prefix: list[int]) -> None:
    """Serve one request of `prefix` to the end, leaving its pages in the prefix cache."""
    scheduler.add_request(Request(100, len(prefix), 1, prompt_token_ids=prefix))
    _run_to_end(scheduler)


def test_lpm_admits_the_request_with_the_longest_cached_prefix_first():
    shared = list(range(1, 33))
    scheduler = _scheduler("lpm")
    _cache_prefix(scheduler, shared)
    cold = Request(0, 36, 2, arrival_s=1.0, prompt_token_ids=list(range(200, 236)))
    warm = Request(1, 36, 2, arrival_s=1.1, prompt_token_ids=[*shared, 7, 7, 7, 7])
    assert _first_admitted(scheduler, [cold, warm], now=2.0) == 1
    fcfs = _scheduler("fcfs")
    _cache_prefix(fcfs, shared)
    cold2 = Request(0, 36, 2, arrival_s=1.0, prompt_token_ids=list(range(200, 236)))
    warm2 = Request(1, 36, 2, arrival_s=1.1, prompt_token_ids=[*shared, 7, 7, 7, 7])
    assert _first_admitted(fcfs, [cold2, warm2], now=2.0) == 0


def test_lpm_keeps_the_queue_as_it_is_above_max_queue_and_without_a_prefix_cache():
    shared = list(range(1, 33))
    for order, eviction in (("lpm:max_queue=1", "lru"), ("lpm", "none")):
        scheduler = _scheduler(order, eviction=eviction)
        _cache_prefix(scheduler, shared)
        cold = Request(0, 36, 2, arrival_s=1.0, prompt_token_ids=list(range(200, 236)))
        warm = Request(1, 36, 2, arrival_s=1.1, prompt_token_ids=[*shared, 7, 7, 7, 7])
        assert _first_admitted(scheduler, [cold, warm], now=2.0) == 0


def test_lpm_defers_a_request_sharing_an_uncached_prefix_with_one_ahead():
    # nothing cached: 0 and 1 share 40 tokens (>= 32), so 1 waits for 0 to compute them and
    # 2 (unrelated) goes before it, as SGLang's in-batch prefix caching does
    scheduler = _scheduler("lpm", max_num_seqs=2)
    common = list(range(300, 340))
    requests = [Request(0, 44, 2, arrival_s=0.0, prompt_token_ids=[*common, 1, 2, 3, 4]),
                Request(1, 44, 2, arrival_s=0.1, prompt_token_ids=[*common, 5, 6, 7, 8]),
                Request(2, 44, 2, arrival_s=0.2, prompt_token_ids=list(range(500, 544)))]
    for request in requests:
        scheduler.add_request(request)
    output = scheduler.schedule(1.0)
    assert [r.request_id for r in output.requests] == [0, 2]
    off = _scheduler("lpm:in_batch=0", max_num_seqs=2)
    fresh = [Request(r.request_id, 44, 2, arrival_s=r.arrival_s,
                     prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
    for request in fresh:
        off.add_request(request)
    assert [r.request_id for r in off.schedule(1.0).requests] == [0, 1]


@pytest.mark.parametrize("spec, words", [
    ("lifo", "unknown policy 'lifo'; valid: fcfs"),
    ("lpm:max_queue", "'max_queue' is not key=value"),
    ("lpm:depth=3", "keys: max_queue, in_batch, max_wait_s"),
    ("sjf:max_wait_s=soon", "is not a number of seconds or none"),
    ("lpm:max_queue=1.5", "is not a whole number"),
    ("priority:max_queue=3", "keys: none"),
])
def test_a_bad_spec_names_the_setting_and_the_choices(spec, words):
    with pytest.raises(KvlabError) as err:
        ServingConfig(scheduling_policy=spec)
    assert words in str(err.value)
    assert err.value.parameters == ("scheduling_policy",)


def test_specs_are_stored_canonical_and_fcfs_stays_out_of_results():
    assert canonical_scheduling_policy(" lpm:max_queue=128,in_batch=32 ") == "lpm"
    assert canonical_scheduling_policy("sjf:max_wait_s=30") == "sjf:max_wait_s=30"
    assert make_order("lpm:max_queue=256").max_queue == 256
    assert "scheduling_policy" not in ServingConfig().result_metadata()
    assert ServingConfig(scheduling_policy="priority").result_metadata()[
        "scheduling_policy"] == "priority"


def test_kvlab_policies_lists_the_scheduling_orders(capsys):
    from kvlab.cli import main

    assert main(["policies"]) == 0
    text = capsys.readouterr().out
    assert "--scheduling-policy NAME[:key=value,...]" in text
    for name in ("fcfs", "priority", "lpm", "sjf", "sjf-oracle"):
        assert f"\n  {name} " in text


def test_lpm_counts_the_prefix_a_tier_below_the_device_holds():
    from kvlab.policies.tiers import TiersConfig, build_tiers, parse_tiers

    config = TiersConfig(parse_tiers("host:64p"))
    manager = KVCacheManager("paged:block_size=4,eviction=lru", 12, max_model_len=256,
                             tiers=build_tiers(config, page_size=4, page_bytes=1),
                             tier_config=config)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256,
                                          max_model_len=256, scheduling_policy="lpm"), manager)
    shared = list(range(1, 33))
    _cache_prefix(scheduler, shared)
    scheduler.add_request(Request(101, 47, 1, prompt_token_ids=list(range(600, 647))))
    _run_to_end(scheduler, now=1.0)  # all 12 pages: the prefix leaves the device
    warm = Request(1, 36, 2, arrival_s=3.1, prompt_token_ids=[*shared, 7, 7, 7, 7])
    assert warm.page_hashes(4)[0] not in manager.pool.cached  # not on the device ...
    assert manager.num_computed_prefix_tokens(warm) == 32  # ... but in the host tier
    cold = Request(0, 36, 2, arrival_s=3.0, prompt_token_ids=list(range(200, 236)))
    assert _first_admitted(scheduler, [cold, warm], now=4.0) == 1
