"""Property tests: random operation sequences through every combination of the policy families."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from kvlab.policies import Request
from tests.policies.harness import Harness

ALLOCATIONS = [
    "paged:block_sizing=fixed",
    "paged:block_sizing=geometric",
    "paged:block_sizing=predicted",
    "buddy:block_sizing=fixed",
    "buddy:block_sizing=geometric",
    "buddy:block_sizing=predicted",
    "contiguous:reserve=max",
    "contiguous:reserve=pow2",
    "contiguous:reserve=oracle",
]
EVICTIONS = ["none", "lru", "fifo", "lfu", "cost"]
PREEMPTIONS = ["recompute", "swap", "auto"]
VICTIMS = ["last-arrived", "longest", "fewest-pages"]
COMBOS = [
    f"{alloc},eviction={ev},preemption={pre},victim={vic}"
    for alloc, ev, pre, vic in itertools.product(ALLOCATIONS, EVICTIONS, PREEMPTIONS, VICTIMS)
]

MAX_MODEL_LEN = 96


@st.composite
def spec_and_memory(draw):
    spec = draw(st.sampled_from(COMBOS))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    num_pages = draw(st.integers(MAX_MODEL_LEN // block_size, 4 * MAX_MODEL_LEN // block_size))
    host_pages = draw(st.sampled_from([None, 0, 8, 64]))
    return spec.replace(":", f":block_size={block_size},", 1), num_pages, host_pages


def _new_request(draw, request_id: int) -> Request:
    # Few distinct prompt families, so prompts share prefixes and the prefix cache gets hits.
    family = draw(st.integers(0, 2))
    prompt_len = draw(st.integers(1, 48))
    max_output = draw(st.integers(1, MAX_MODEL_LEN - prompt_len))
    content = draw(st.sampled_from(["token_ids", "hash_ids", "unknown"]))
    if content == "hash_ids":
        # Trace-style block ids. Family 2 is family 0's ids one block later: the same id at
        # another position, which must share nothing.
        block = 8 if family == 1 else 4
        first = {0: 0, 1: 100, 2: 1}[family]
        hash_ids = tuple(range(first, first + -(-prompt_len // block)))
        return Request(request_id, prompt_len, max_output, arrival_s=request_id,
                       hash_ids=hash_ids, hash_block_size=block)
    ids = [(family * 7 + i) % 11 for i in range(prompt_len)] if content == "token_ids" else None
    return Request(request_id, prompt_len, max_output, arrival_s=request_id, prompt_token_ids=ids)


def _run(data, spec: str, num_pages: int, host_pages, num_ops: int) -> Harness:
    h = Harness(spec, num_pages, MAX_MODEL_LEN, host_pages)
    next_id = 0
    for _ in range(num_ops):
        op = data.draw(
            st.sampled_from(
                ["add", "add", "grow", "grow", "grow", "free", "fork", "swap_out", "swap_in"]
            )
        )
        live, swapped = list(h.live.values()), list(h.swapped.values())
        if op == "add":
            h.add(_new_request(data.draw, next_id))
            next_id += 1
        elif op == "grow" and live:
            seq = data.draw(st.sampled_from(live))
            room = seq.total_len - seq.num_tokens
            if room > 0:
                h.grow(seq, data.draw(st.integers(1, min(room, 20))))
        elif op == "free" and (live or swapped):
            h.free(data.draw(st.sampled_from(live + swapped)))
        elif op == "fork" and live:
            parent = data.draw(st.sampled_from(live))
            child = Request(
                next_id,
                parent.prompt_len,
                parent.max_output_tokens,
                arrival_s=next_id,
                prompt_token_ids=parent.prompt_token_ids,
                hash_ids=parent.hash_ids,
                hash_block_size=parent.hash_block_size,
            )
            next_id += 1
            child_content = {i: h.content(parent, i) for i in range(parent.num_computed_tokens)}
            h.fork(parent, child)
            # the child's logical tokens are the parent's up to the fork
            h_content = h.content

            def content(seq, index, _child=child, _copied=child_content, _orig=h_content):
                if seq is _child and index in _copied:
                    return _copied[index]
                return _orig(seq, index)

            h.content = content
        elif op == "swap_out" and live:
            h.swap_out(data.draw(st.sampled_from(live)))
        elif op == "swap_in" and swapped:
            h.swap_in(data.draw(st.sampled_from(swapped)))
        h.check()
    return h


@given(memory=spec_and_memory(), data=st.data())
def test_invariants_hold_after_every_operation(memory, data):
    spec, num_pages, host_pages = memory
    h = _run(data, spec, num_pages, host_pages, num_ops=40)
    for seq in list(h.live.values()) + list(h.swapped.values()):
        h.free(seq)
        h.check()
    usage = h.manager.usage()
    assert usage.num_used_pages == 0, "a page is still in use after every sequence finished"
    assert usage.num_free_pages + usage.num_cached_free_pages == usage.num_total_pages
    assert usage.num_host_used_pages == 0


@given(memory=spec_and_memory(), seed=st.integers(0, 2**32 - 1))
def test_same_inputs_same_decisions(memory, seed):
    spec, num_pages, host_pages = memory

    def decisions():
        import random

        from hypothesis.strategies import DataObject  # noqa: F401  (type only)

        rng = random.Random(seed)
        h = Harness(spec, num_pages, MAX_MODEL_LEN, host_pages)
        for request_id in range(30):
            prompt = rng.randint(1, 40)
            ids = [rng.randint(0, 3) for _ in range(prompt)] if rng.random() < 0.5 else None
            seq = Request(
                request_id, prompt, rng.randint(1, MAX_MODEL_LEN - prompt), prompt_token_ids=ids
            )
            h.add(seq)
            for live in list(h.live.values()):
                if rng.random() < 0.5 and live.num_tokens < live.total_len:
                    h.grow(live, 1)
                if rng.random() < 0.2:
                    h.free(live)
            if h.live and rng.random() < 0.2:
                h.swap_out(min(h.live.values(), key=lambda s: s.request_id))
            if h.swapped and rng.random() < 0.3:
                h.swap_in(min(h.swapped.values(), key=lambda s: s.request_id))
        return h.log, h.manager.usage()

    assert decisions() == decisions()
