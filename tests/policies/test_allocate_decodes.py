"""`allocate_decodes` makes exactly the decisions of `allocate(request, 1)` called one by one."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies import KVCacheManager, Request


def _decode_batch(draw) -> tuple[str, int, list[Request], int]:
    page = draw(st.sampled_from([1, 2, 4, 16]))
    eviction = draw(st.sampled_from(["none", "lru"]))
    sizing = draw(st.sampled_from(["fixed", "geometric"]))
    num_pages = draw(st.integers(4, 64))
    requests = []
    for request_id in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, 40))
        ids = [i % 3 for i in range(prompt)] if draw(st.booleans()) else None
        requests.append(Request(request_id, prompt, 200, prompt_token_ids=ids))
    spec = f"paged:block_size={page},eviction={eviction},block_sizing={sizing}"
    return spec, num_pages, requests, draw(st.integers(1, 20))


def _admitted(spec: str, num_pages: int, requests: list[Request]) -> tuple[KVCacheManager, list]:
    manager = KVCacheManager(spec, num_pages, max_model_len=256)
    running = []
    for request in requests:
        request.num_computed_tokens = manager.num_computed_prefix_tokens(request)
        if manager.allocate(request, request.prompt_len - request.num_computed_tokens) is None:
            request.num_computed_tokens = 0
            continue
        request.num_computed_tokens = request.prompt_len
        request.num_output_tokens = 1  # the prefill sampled one: each is now a decode
        running.append(request)
    return manager, running


def _state(manager: KVCacheManager, running: list[Request]) -> tuple:
    return (
        [list(manager.block_table(r)) for r in running],
        manager.usage(),
        dict(manager.pool.owners),
        list(manager.evictor.pages()),
    )


@given(data=st.data())
def test_batched_decodes_match_one_by_one(data):
    spec, num_pages, requests, num_steps = _decode_batch(data.draw)
    twin = copy.deepcopy(requests)
    batched, running_a = _admitted(spec, num_pages, requests)
    single, running_b = _admitted(spec, num_pages, twin)
    for _ in range(num_steps):
        claimed = batched.allocate_decodes(running_a, 0, len(running_a))
        expected = 0
        for request in running_b:
            if single.allocate(request, 1) is None:
                break
            expected += 1
        # the batched run may stop early where allocate() needs its planner; never later
        assert claimed <= expected
        for request in running_a[claimed:expected]:
            assert batched.allocate(request, 1) is not None
        running_a, running_b = running_a[:expected], running_b[:expected]
        for request in (*running_a, *running_b):
            request.num_computed_tokens += 1
            request.num_output_tokens += 1
        assert _state(batched, running_a) == _state(single, running_b)
