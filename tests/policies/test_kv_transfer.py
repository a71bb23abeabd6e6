"""A request whose KV another instance computed (prefill/decode disaggregation): admitted with
its transferred tokens counted computed, pages taken for them and named in `transfer_ins`, and
recomputed in full if it is preempted."""

from __future__ import annotations

from kvlab.policies import KVCacheManager, Request, Scheduler, SchedulerConfig

PAGE = 4


def _handed_off(request_id: int, prompt_len: int, output: int, **content) -> Request:
    """A request as a prefill instance hands it over: prompt computed there, first token out."""
    request = Request(request_id, prompt_len, output, **content)
    request.num_output_tokens = 1
    request.kv_transfer_tokens = prompt_len
    return request


def _scheduler(num_pages: int, spec: str = f"paged:block_size={PAGE}") -> Scheduler:
    manager = KVCacheManager(spec, num_pages, max_model_len=64)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=64), manager)


def test_a_handed_off_request_decodes_at_once_into_the_pages_it_receives():
    scheduler = _scheduler(32)
    request = _handed_off(0, 10, 5)
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert output.num_new_tokens == [1] and output.num_computed_tokens == [10]
    assert output.num_prefill_tokens == 0 and output.num_decode_tokens == 1
    table = scheduler.manager.block_table(request)
    assert output.mem_ops.transfer_ins == table[:3]  # 10 tokens: three pages, the last partly
    assert len(table) == 3  # the first output token's slot is in the third page
    scheduler.update(output, None, 1.0)
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        assert not output.mem_ops.transfer_ins
        scheduler.update(output, None, 2.0)
    assert request.num_output_tokens == 5 and scheduler.manager.usage().num_used_pages == 0


def test_only_the_pages_not_cached_here_are_received():
    scheduler = _scheduler(32, f"paged:block_size={PAGE},eviction=lru")
    ids = list(range(100, 112))
    first = Request(0, 12, 2, prompt_token_ids=ids)
    scheduler.add_request(first)
    while scheduler.has_unfinished():
        scheduler.update(scheduler.schedule(), None, 0.0)
    request = _handed_off(1, 12, 3, prompt_token_ids=[*ids[:8], 7, 7, 7, 7])
    scheduler.add_request(request)
    output = scheduler.schedule()
    table = scheduler.manager.block_table(request)
    assert output.num_computed_tokens == [12]
    assert output.mem_ops.transfer_ins == table[2:3]  # pages 0-1 hit here, page 2 sent


def test_a_preempted_handed_off_request_is_recomputed_here():
    scheduler = _scheduler(8)  # room for both prompts, not for both to grow
    first, second = _handed_off(0, 12, 8), _handed_off(1, 12, 8)
    for request in (first, second):
        scheduler.add_request(request)
    preempted = []
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        preempted += output.preempted
        scheduler.update(output, None, 0.0)
    assert preempted and all(r.kv_transfer_tokens == 0 for r in preempted)
    assert first.num_output_tokens == second.num_output_tokens == 8


def test_hits_below_the_device_and_a_transfer_in_one_admission():
    from kvlab.policies.tiers import TiersConfig, TierSpec, build_tiers

    config = TiersConfig((TierSpec("host", size_pages=2),))
    manager = KVCacheManager(f"paged:block_size={PAGE},eviction=lru", 6, max_model_len=64,
                             tiers=build_tiers(config, page_size=PAGE, page_bytes=1),
                             tier_config=config)
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=64),
                          manager)

    def serve(request: Request) -> list:
        scheduler.add_request(request)
        outputs = []
        while scheduler.has_unfinished():
            outputs.append(scheduler.schedule())
            scheduler.update(outputs[-1], None, 0.0)
            manager.check_tiers()
        return outputs

    ids = list(range(1, 9))
    serve(Request(0, 8, 1, prompt_token_ids=ids))  # its two pages cached on the device
    serve(Request(1, 20, 1, prompt_token_ids=[50] * 20))  # evicts them to the host tier
    handed = _handed_off(2, 12, 2, prompt_token_ids=[*ids, 9, 9, 9, 9])
    first = serve(handed)[0]
    # page 0 still on the device (evicted last, the root), page 1 from the host tier, page 2
    # from the other instance
    assert first.num_computed_tokens == [12]
    (load,) = first.mem_ops.tier_loads
    assert load.src_level == 1 and len(load.dst_pages) == 1
    assert len(first.mem_ops.transfer_ins) == 1
    # the tier's pages keep their own keys: evicting them all finds each one's content
    serve(Request(3, 20, 1, prompt_token_ids=[70] * 20))
    host = manager.tiers[0]
    assert host.stats.num_evictions >= 2 and set(host.store.keys()) <= {
        *Request(9, 20, 1, prompt_token_ids=[70] * 20).page_hashes(PAGE),
        *Request(9, 20, 1, prompt_token_ids=[50] * 20).page_hashes(PAGE),
        *Request(9, 12, 1, prompt_token_ids=[*ids, 9, 9, 9, 9]).page_hashes(PAGE)}
