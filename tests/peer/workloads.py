"""Forced-preemption workloads for the peer tests and `benchmarks/vllm_preemptions.py` that are
not one of the trace loaders' synthetic kinds."""

from __future__ import annotations

import dataclasses
import random

from kvlab.traces.types import Trace, TraceRequest

LEAD_PROMPT, LEAD_OUTPUT = 1000, 200  # 32 of vLLM's 39 usable blocks (of 40), growing to 38
FOLLOWER_PROMPTS = (256, 384)  # 8-12 blocks of 32: more than the lead ever leaves free
FOLLOWER_OUTPUTS = (64, 192)
FOLLOWER_GAP_S = 0.005


def queued_behind_a_long_request(num_followers: int = 31, seed: int = 0) -> Trace:
    """A long request first (a 1,000-token prompt, 200 tokens out), then `num_followers`
    requests sent 5 ms apart, each too large for the blocks the first leaves free on a
    40-block vLLM (block 32). So all of them queue while it runs (200 steps), in send order,
    and which step an arrival falls in cannot change any decision: after the first finishes,
    both schedulers admit and preempt from the same queue. (On a plain burst the count
    depends on how the server's front end spreads the arrivals over its first steps, which
    the client's send times do not show.) Needs max_model_len >= 1200."""
    rng = random.Random(seed)
    requests = [TraceRequest(request_id=0, arrival_s=0.0, input_len=LEAD_PROMPT,
                             output_len=LEAD_OUTPUT)]
    for index in range(1, num_followers + 1):
        requests.append(TraceRequest(
            request_id=index, arrival_s=FOLLOWER_GAP_S * index,
            input_len=rng.randint(*FOLLOWER_PROMPTS), output_len=rng.randint(*FOLLOWER_OUTPUTS)))
    return Trace(name="queued-behind-a-long-request", dataset_name="random", source="synthetic",
                 requests=requests)


PRIORITY_WORKLOADS = ("queued-random", "queued-reversed", "burst-random")


def priority_workload(name: str) -> Trace:
    """Forced-preemption workloads whose requests carry priorities (for a vLLM started with
    `--scheduling-policy priority`, 40 blocks of 32): `queued-random`, followers queued behind
    a long request with priorities 0-3 at random; `queued-reversed`, priorities rising against
    arrival (the last sent first); `burst-random`, a burst of 32 with priorities 0-3."""
    from kvlab.traces import load_trace

    rng = random.Random(7)
    if name == "queued-random":
        trace = queued_behind_a_long_request()
        priorities = [rng.randint(0, 3) for _ in trace.requests]
    elif name == "queued-reversed":
        trace = queued_behind_a_long_request(seed=1)
        priorities = [len(trace.requests) - i for i in range(len(trace.requests))]
    else:
        assert name == "burst-random", name
        trace = load_trace("random", None, num_prompts=32, seed=2, random_input_len=256,
                           random_output_len=128, random_range_ratio=0.5)
        priorities = [rng.randint(0, 3) for _ in trace.requests]
    requests = [dataclasses.replace(r, priority=p)
                for r, p in zip(trace.requests, priorities, strict=True)]
    return dataclasses.replace(trace, requests=requests)
