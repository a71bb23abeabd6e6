"""Run by the peer's Python (tests/peer/test_peer_offload_policy.py): kvlab's offloading
`CachePolicy` adapters (kvlab.integrations.vllm.offload) against vLLM 0.32's `CachePolicy`
contract, driven directly and through vLLM's own `CPUOffloadingManager`. Prints one JSON object:
case -> "ok" or what went wrong."""

from __future__ import annotations

import json
import random
import sys
import traceback

from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from kvlab.integrations.vllm import offload

MODULE = "kvlab.integrations.vllm.offload"
CLASSES = ("KvlabLRU", "KvlabFIFO", "KvlabLFU", "KvlabSLRU", "KvlabARC", "KvlabCost")


def key(number: int) -> bytes:
    return number.to_bytes(8, "big")


def ready(chunk_id: int) -> ChunkStatus:
    chunk = ChunkStatus(chunk_id)
    chunk.ref_cnt = 0
    return chunk


def filled(name: str, num_chunks: int = 4):
    policy = getattr(offload, name)(cache_capacity=num_chunks)
    for number in range(num_chunks):
        policy.insert(key(number), ready(number))
    return policy


def inserted_chunks_come_back(name: str) -> None:
    policy = filled(name)
    assert policy.get(key(2)).chunk_id == 2
    assert policy.get(key(9)) is None


def evicts_exactly_n(name: str) -> None:
    policy = filled(name)
    evicted = policy.evict(3, set())
    assert evicted is not None and len({k for k, _ in evicted}) == 3, evicted
    assert all(policy.get(k) is None for k, _ in evicted)
    assert policy.evict(0, set()) == []


def too_many_changes_nothing(name: str) -> None:
    policy = filled(name)
    assert policy.evict(5, set()) is None
    assert all(policy.get(key(n)) is not None for n in range(4))
    assert policy.evict(4, set()) is not None


def protected_chunks_stay(name: str) -> None:
    policy = filled(name)
    protected = {key(0), key(1)}
    assert policy.evict(3, protected) is None
    evicted = policy.evict(2, protected)
    assert evicted is not None and {k for k, _ in evicted} == {key(2), key(3)}, evicted
    assert policy.get(key(0)) is not None and policy.get(key(1)) is not None


def pending_and_read_chunks_stay(name: str) -> None:
    policy = getattr(offload, name)(cache_capacity=3)
    policy.insert(key(0), ChunkStatus(0))  # not ready: a store in flight
    policy.insert(key(1), ready(1))
    policy.insert(key(2), ready(2))
    policy.mark_non_evictable(key(2))  # a load reads it
    assert policy.evict(2, set()) is None
    evicted = policy.evict(1, set())
    assert evicted is not None and evicted[0][0] == key(1), evicted
    policy.get(key(0)).ref_cnt = 0  # the store completed
    policy.mark_evictable(key(0))
    evicted = policy.evict(1, set())
    assert evicted is not None and evicted[0][0] == key(0), evicted
    assert policy.get(key(2)) is not None


def clear_forgets_everything(name: str) -> None:
    policy = filled(name)
    policy.clear()
    assert policy.get(key(0)) is None
    assert policy.evict(1, set()) is None


def removed_chunk_is_gone(name: str) -> None:
    policy = filled(name)
    policy.remove(key(1))
    assert policy.get(key(1)) is None
    evicted = policy.evict(3, set())
    assert evicted is not None and key(1) not in {k for k, _ in evicted}


def lru_matches_vllms_lru() -> None:
    """kvlab's lru evicts as vLLM's own LRU on stores, reuses and evictions (vLLM's manager
    drives both)."""
    victims = {}
    for policy in ("lru", "KvlabLRU"):
        rng = random.Random(7)
        manager = CPUOffloadingManager(num_chunks=16, cache_policy=policy,
                                       cache_policy_module_path=None if policy == "lru"
                                       else MODULE, enable_events=True)
        evicted = []
        for request in range(60):
            context = ReqContext(req_id=str(request))
            manager.on_new_request(context)
            keys = [key(n) for n in rng.sample(range(40), 5)]
            stored = [k for k in keys if manager.lookup(k, context).name == "HIT"]
            if stored:
                manager.prepare_load(stored, context)
                manager.complete_load(stored, context)
            output = manager.prepare_store(keys, context)
            if output is not None:
                evicted.append(sorted(output.evicted_keys))
                manager.complete_store(output.keys_to_store, context)
            manager.on_request_finished(context)
        victims[policy] = evicted
    assert sum(map(len, victims["lru"])) > 50, "the workload must evict"
    assert victims["lru"] == victims["KvlabLRU"], "kvlab's lru and vLLM's LRU parted"


def lfu_keeps_the_reused_chunk() -> None:
    policy = filled("KvlabLFU", 2)
    context = ReqContext(req_id="r")
    policy.on_request_finished([[key(0)]], set(), {key(0)}, context)
    policy.on_request_finished([[key(1)]], {key(1)}, set(), context)  # newer, never reused
    assert policy.evict(1, set())[0][0] == key(1)


def arc_keeps_the_reused_chunk_through_a_scan() -> None:
    policy = filled("KvlabARC", 4)
    context = ReqContext(req_id="r")
    policy.on_request_finished([[key(0)]], set(), {key(0)}, context)
    for number in range(4, 8):  # a scan of once-used chunks
        victims = policy.evict(1, set())
        policy.insert(key(number), ready(victims[0][1].chunk_id))
    assert policy.get(key(0)) is not None


def every_class_serves_vllms_manager() -> None:
    for name in CLASSES:
        manager = CPUOffloadingManager(num_chunks=8, cache_policy=name,
                                       cache_policy_module_path=MODULE)
        for request in range(20):
            context = ReqContext(req_id=str(request))
            manager.on_new_request(context)
            keys = [key(request * 3 + n) for n in range(4)]
            output = manager.prepare_store(keys, context)
            assert output is not None, (name, request)
            manager.complete_store(output.keys_to_store, context)
            manager.on_request_finished(context)


CONTRACT = (inserted_chunks_come_back, evicts_exactly_n, too_many_changes_nothing,
            protected_chunks_stay, pending_and_read_chunks_stay, clear_forgets_everything,
            removed_chunk_is_gone)
SINGLE = (lru_matches_vllms_lru, lfu_keeps_the_reused_chunk,
          arc_keeps_the_reused_chunk_through_a_scan, every_class_serves_vllms_manager)


def main() -> None:
    results = {}
    cases = [(f"{case.__name__}[{name}]", case, (name,)) for case in CONTRACT
             for name in CLASSES]
    cases += [(case.__name__, case, ()) for case in SINGLE]
    for label, case, args in cases:
        try:
            case(*args)
            results[label] = "ok"
        except Exception:
            results[label] = traceback.format_exc(limit=3)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
