"""Property tests: random operation sequences through every combination of the policy families."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

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
EVICTIONS = ["none", "lru", "fifo", "lfu", "cost", "arc", "slru"]
PREEMPTIONS = ["recompute", "swap", "auto"]
VICTIMS = ["last-arrived", "last-admitted", "longest", "fewest-pages"]
COMBOS = [
    f"{alloc},eviction={ev},preemption={pre},victim={vic}"
    for alloc, ev, pre, vic in itertools.product(ALLOCATIONS, EVICTIONS, PREEMPTIONS, VICTIMS)
]

MAX_MODEL_LEN = 96


@st.composite
def spec_and_memory(draw):
    spec = draw(st.sampled_from(COMBOS))
    block_size = draw(st.sampled_from([1, 2, 2, 4, 8]))
    # From half a maximal request (pressure: evictions, refusals) to four of them.
    num_pages = draw(st.integers(MAX_MODEL_LEN // block_size // 2, 4 * MAX_MODEL_LEN // block_size))
    host_pages = draw(st.sampled_from([None, 0, 8, 64]))
    return spec.replace(":", f":block_size={block_size},", 1), num_pages, host_pages


def new_request(rng: random.Random, request_id: int) -> Request:
    """A request whose prompt shares prefixes with others: token ids from three families
    (prefixes of three strings), trace block ids, or no content at all."""
    family = rng.randrange(3)
    prompt_len = rng.randint(1, 48)
    max_output = rng.randint(1, MAX_MODEL_LEN - prompt_len)
    content = rng.choice(["token_ids", "token_ids", "token_ids", "hash_ids", "unknown"])
    if content == "hash_ids":
        # Trace-style block ids, one block size per id space (as in any trace). Family 2 is
        # family 0's ids one block later: the same id at another position, which must share
        # nothing.
        block = 8 if family == 1 else 4
        first = {0: 0, 1: 100, 2: 1}[family]
        hash_ids = tuple(range(first, first + -(-prompt_len // block)))
        return Request(request_id, prompt_len, max_output, arrival_s=request_id,
                       hash_ids=hash_ids, hash_block_size=block)
    ids = [(family * 7 + i) % 11 for i in range(prompt_len)] if content == "token_ids" else None
    # Outputs with known ids are hashed as their pages fill (the engine's case).
    known = ids is not None and rng.random() < 0.5
    return Request(request_id, prompt_len, max_output, arrival_s=request_id, prompt_token_ids=ids,
                   output_ids_known=known)


OPS = ["add", "add_chunk", "add_chunk", "lookup", "grow", "grow", "grow", "free", "free",
       "fork", "swap_out", "swap_in"]


def run_walk(spec: str, num_pages: int, host_pages, seed: int, num_ops: int,
             after_op: Callable[[Harness], None] | None = None) -> Harness:
    """A random walk of `num_ops` operations through one manager, checked after each (and
    handed to `after_op`, which is also called once before the first)."""
    rng = random.Random(seed)
    h = Harness(spec, num_pages, MAX_MODEL_LEN, host_pages)
    if after_op is not None:
        after_op(h)
    next_id = 0
    for _ in range(num_ops):
        op = rng.choice(OPS)
        live, swapped = list(h.live.values()), list(h.swapped.values())
        if op in ("add", "add_chunk", "lookup"):
            seq = new_request(rng, next_id)
            next_id += 1
            hit = h.lookup(seq)
            if op == "lookup":
                # Admit with this hit later, after operations that changed the cache (growth
                # may evict the very pages it found) and with no lookup in between.
                for other in rng.sample(live, min(len(live), 3)):
                    _grow(rng, h, other)
                _admit_looked_up(h, seq, hit)
            else:  # chunked prefill: a first chunk only, often short of a page
                rest = seq.num_tokens - hit
                chunk = rng.randint(1, min(rest, rng.choice([2, rest])))
                h.add(seq, chunk if op == "add_chunk" else None, hit)
        elif op == "grow" and live:
            _grow(rng, h, rng.choice(live))
        elif op == "free" and (live or swapped):
            h.free(rng.choice(live + swapped))
        elif op == "fork" and live:
            parent = rng.choice(live)
            child = Request(
                next_id,
                parent.prompt_len,
                parent.max_output_tokens,
                arrival_s=next_id,
                prompt_token_ids=parent.prompt_token_ids,
                hash_ids=parent.hash_ids,
                hash_block_size=parent.hash_block_size,
                output_ids_known=parent.output_ids_known,
            )
            next_id += 1
            h.fork(parent, child)
        elif op == "swap_out" and live:
            h.swap_out(rng.choice(live))
        elif op == "swap_in" and swapped:
            h.swap_in(rng.choice(swapped))
        h.check()
        if after_op is not None:
            after_op(h)
    return h


def _grow(rng: random.Random, h: Harness, seq: Request) -> None:
    room = seq.total_len - seq.num_tokens
    if room > 0:
        h.grow(seq, rng.randint(1, min(room, rng.choice([1, 20]))))


def _admit_looked_up(h: Harness, seq: Request, earlier_hit: int) -> None:
    """Admit with an earlier lookup's hit: allocate must take pages that hold the request's
    tokens (the shadow checks them), or refuse a hit that is no longer cached; it must never
    hand out pages that hold other content now."""
    try:
        h.add(seq, hit=earlier_hit)
    except ValueError as error:
        assert "prefix cache holds" in str(error)
        assert h.manager.block_table(seq) == []
        seq.num_computed_tokens = 0
        assert h.manager.num_computed_prefix_tokens(seq) < earlier_hit, "refused a valid hit"


@given(memory=spec_and_memory(), seed=st.integers(0, 2**32 - 1))
def test_invariants_hold_after_every_operation(memory, seed):
    spec, num_pages, host_pages = memory
    h = run_walk(spec, num_pages, host_pages, seed, num_ops=150)
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
