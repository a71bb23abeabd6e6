"""Forced-preemption workloads for the peer tests and `benchmarks/vllm_preemptions.py` that are
not one of the trace loaders' synthetic kinds."""

from __future__ import annotations

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
