"""Speed of the KV-cache manager: the lifetimes of every request of the Azure conv trace.

Each request's prompt is allocated at once (with its prefix-cache hit), then one token per
decode step until its output is done, in a rolling batch of 256, as in the vLLM and nano-vllm
measurements quoted in FACTS.md (vLLM 0.27.1: 64 s, nano-vllm: 16.6 s on this machine). A share of
the requests (30% by default) share a 512-token prompt prefix, named by trace-style hash ids.

    python benchmarks/policies_bench.py [--path azure2023_conv.csv] [--page-size 16]
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from kvlab.policies import KVCacheManager, Request
from kvlab.traces import load_azure

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/azure2023_conv.csv"


def build_requests(path: Path, shared_fraction: float, prefix_len: int) -> list[Request]:
    """One request per trace row; every k-th of them starts with the shared prefix."""
    trace = load_azure(path)
    every = round(1 / shared_fraction) if shared_fraction else 0
    requests = []
    for row in trace.requests:
        num_blocks = -(-row.input_len // prefix_len)
        # block ids unique to this request, except block 0 for the sharing ones
        ids = [1_000_000 + row.request_id * 64 + k for k in range(num_blocks)]
        if every and row.request_id % every < round(every * shared_fraction) and (
            row.input_len > prefix_len
        ):
            ids[0] = 0
        requests.append(
            Request(row.request_id, row.input_len, row.output_len, hash_ids=tuple(ids),
                    hash_block_size=prefix_len)
        )
    return requests


def drive(manager: KVCacheManager, requests: list[Request], batch: int) -> tuple[int, int]:
    """Run every lifetime; returns (decode token-steps, page operations)."""
    allocate, free, table = manager.allocate, manager.free, manager.block_table
    active: list[Request] = []
    next_index = num_steps = num_page_ops = 0
    while next_index < len(requests) or active:
        while len(active) < batch and next_index < len(requests):
            request = requests[next_index]
            next_index += 1
            request.num_computed_tokens = manager.num_computed_prefix_tokens(request)
            if allocate(request, request.prompt_len - request.num_computed_tokens) is None:
                raise SystemExit("out of KV pages: raise --num-pages")
            request.num_computed_tokens = request.prompt_len
            active.append(request)
        still = []
        for request in active:
            allocate(request, 1)
            request.num_computed_tokens += 1
            request.num_output_tokens += 1
            if request.num_output_tokens < request.max_output_tokens:
                still.append(request)
            else:
                num_page_ops += 2 * len(table(request))  # each page taken once, released once
                free(request)
        num_steps += len(active)
        active = still
    return num_steps, num_page_ops


def main() -> None:
    """Parse flags, run the benchmark, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=DEFAULT_TRACE, help="Azure conv trace CSV")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256, help="requests decoding together")
    parser.add_argument("--num-pages", type=int, default=400_000)
    parser.add_argument("--shared-fraction", type=float, default=0.3)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--policy", default="paged:eviction=lru",
                        help="policy spec (block_size is set by --page-size)")
    args = parser.parse_args()

    requests = build_requests(args.path, args.shared_fraction, args.prefix_len)
    spec = f"{args.policy}{',' if ':' in args.policy else ':'}block_size={args.page_size}"
    manager = KVCacheManager(spec, args.num_pages, max_model_len=32768)
    gc.collect()
    gc.freeze()  # the requests live all run long: keep them out of every collection
    start, start_cpu = time.perf_counter(), time.process_time()
    num_steps, num_page_ops = drive(manager, requests, args.batch)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    usage = manager.usage()
    print(f"policy                     {manager.policy}")
    print(f"requests                   {len(requests):,}")
    print(f"decode token-steps         {num_steps:,}")
    print(f"wall time (s)              {wall:.2f}")
    print(f"CPU time (s)               {cpu:.2f}   (differs from wall time on a busy machine)")
    print(f"page operations per second {num_page_ops / wall:,.0f}")
    print(f"ns per decode token-step   {wall / num_steps * 1e9:,.0f}")
    print(f"prefix-cache hit pages     {usage.num_prefix_hits:,} of {usage.num_prefix_queries:,}")


if __name__ == "__main__":
    main()
