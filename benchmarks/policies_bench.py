"""Speed of the KV-cache manager: the lifetimes of every request of the Azure conv trace.

Each request's prompt is allocated at once (with its prefix-cache hit; the prefill samples the
first output token), then one token per decode step until its output is done, in a rolling batch
of 256, as in the vLLM and nano-vllm
measurements quoted in FACTS.md (vLLM 0.27.1: 64 s, nano-vllm: 16.6 s on this machine). A share of
the requests (30% by default) share a 512-token prompt prefix, named by trace-style hash ids.
It runs on fresh state with one `allocate()` call per decode, then with the runs of decodes
given to `allocate_decodes()` as the scheduler does, and checks both end alike. Each way runs
`--repeat` times, alternating, and the best and median times are printed: on a shared machine
other work only ever adds time, so the best run is the closest to the code's own speed.

    python benchmarks/policies_bench.py [--path azure2023_conv.csv] [--page-size 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
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


def admit(manager: KVCacheManager, request: Request) -> None:
    """Allocate the prompt with its prefix-cache hit; the prefill samples the first token."""
    request.num_computed_tokens = manager.num_computed_prefix_tokens(request)
    if manager.allocate(request, request.prompt_len - request.num_computed_tokens) is None:
        raise SystemExit("out of KV pages: raise --num-pages")
    request.num_computed_tokens = request.prompt_len
    request.num_output_tokens = 1


def drive(
    manager: KVCacheManager, requests: list[Request], batch: int, batched: bool
) -> tuple[int, int]:
    """Run every lifetime, one `allocate(request, 1)` per decode or (`batched`) runs of decodes
    through `allocate_decodes`, as the scheduler does; returns (decode token-steps, page ops)."""
    allocate, allocate_decodes = manager.allocate, manager.allocate_decodes
    active: list[Request] = []
    finishing: dict[int, list[Request]] = {}  # step -> requests whose last decode it is
    next_index = step = num_steps = num_page_ops = 0

    def free(request: Request) -> None:
        nonlocal num_page_ops
        num_page_ops += 2 * manager.num_pages_held(request)  # each taken once, released once
        manager.free(request)

    while next_index < len(requests) or active:
        while len(active) < batch and next_index < len(requests):
            request = requests[next_index]
            next_index += 1
            admit(manager, request)
            num_decodes = request.max_output_tokens - request.num_output_tokens
            if num_decodes:
                active.append(request)
                finishing.setdefault(step + num_decodes, []).append(request)
            else:
                free(request)
        if batched:
            index = 0
            while index < len(active):
                index += allocate_decodes(active, index, len(active) - index)
                if index < len(active):  # a run stops where a decode needs the general path
                    allocate(active[index], 1)
                    index += 1
            for request in active:  # the forward pass computed one token and sampled the next
                request.num_computed_tokens += 1
                request.num_output_tokens += 1
        else:
            # One pass: a request's allocation reads only its own counters, so advancing each
            # right after its call decides exactly what allocating all of them first would.
            for request in active:
                allocate(request, 1)
                request.num_computed_tokens += 1
                request.num_output_tokens += 1
        num_steps += len(active)
        step += 1
        for request in finishing.pop(step, ()):  # in batch order, as a scheduler frees them
            active.remove(request)
            free(request)
    return num_steps, num_page_ops


def measure(args: argparse.Namespace, batched: bool) -> tuple[KVCacheManager, tuple, float, float]:
    """One run on fresh requests and a fresh manager: (manager, (requests, token-steps, page
    operations), wall s, CPU s)."""
    requests = build_requests(args.path, args.shared_fraction, args.prefix_len)
    spec = f"{args.policy}{',' if ':' in args.policy else ':'}block_size={args.page_size}"
    manager = KVCacheManager(spec, args.num_pages, max_model_len=32768)
    gc.collect()
    gc.freeze()  # the requests live all run long: keep them out of every collection
    start, start_cpu = time.perf_counter(), time.process_time()
    counts = (len(requests), *drive(manager, requests, args.batch, batched))
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    gc.unfreeze()
    return manager, counts, wall, cpu


def main() -> None:
    """Parse flags, run the benchmark both ways, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=DEFAULT_TRACE, help="Azure conv trace CSV")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256, help="requests decoding together")
    parser.add_argument("--num-pages", type=int, default=400_000)
    parser.add_argument("--shared-fraction", type=float, default=0.3)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--policy", default="paged:eviction=lru",
                        help="policy spec (block_size is set by --page-size)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each way (at least 1)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: expected at least 1")
    if not args.path.is_file():  # the default is the checkout's ../shared, as on this machine
        parser.error(f"--path {args.path}: no such file; expected the Azure conv trace CSV")

    runs: dict[bool, list] = {False: [], True: []}  # (usage at the end, counts, wall, CPU)
    for _ in range(args.repeat):
        for batched in (False, True):
            manager, *figures = measure(args, batched)
            runs[batched].append((manager.usage(), *figures))
            policy = manager.policy
            del manager  # one run's memory at a time
    usage, (num_requests, num_steps, num_page_ops), _, _ = runs[False][0]
    # Every run must make the same decisions: the same counts and memory at the end.
    for run in runs[False] + runs[True]:
        if run[:2] != runs[False][0][:2]:
            raise SystemExit("allocate_decodes and allocate one by one disagree")
    print(f"policy                     {policy}")
    print(f"requests                   {num_requests:,}")
    print(f"decode token-steps         {num_steps:,}")
    print(f"prefix-cache hit pages     {usage.num_prefix_hits:,} of {usage.num_prefix_queries:,}")
    for batched, label in ((False, "allocate() per decode"), (True, "allocate_decodes() runs")):
        walls = [run[2] for run in runs[batched]]
        cpus = [run[3] for run in runs[batched]]
        wall = min(walls)
        print(f"--- {label}: best of {args.repeat}")
        print(f"wall time (s)              {wall:.2f}   (median {statistics.median(walls):.2f})")
        print(f"CPU time (s)               {min(cpus):.2f}   (differs from wall time on a busy "
              "machine)")
        print(f"page operations per second {num_page_ops / wall:,.0f}")
        print(f"ns per decode token-step   {wall / num_steps * 1e9:,.0f}")


if __name__ == "__main__":
    main()
