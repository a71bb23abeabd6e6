"""kvlab's KV-cache manager against vLLM's and nano-vllm's on the same request lifetimes.

The first `--num-requests` rows of the Azure conv trace become request lifetimes with token ids:
a prompt (30% of them starting with one of 8 shared 512-token prefixes, the rest of it random
ids) and its output ids. Each manager drives them alike, in a rolling batch of `--batch`: a
request is admitted with its prompt's prefix-cache hit and the rest of the prompt allocated at
once (the prefill samples the first output token), then allocated one slot and appended one
output token per decode step, and freed after its last; prefix caching on, output pages cached
as they fill. Sides, each in a fresh process of its own python, `--repeat` times in turn:

- kvlab: `kvlab.policies.KVCacheManager` (`paged:eviction=lru`, watermark 0), `allocate(req, 1)`
  per decode;
- vllm: `vllm.v1.core.kv_cache_manager.KVCacheManager` with `vllm.v1.request.Request` (one
  full-attention group, its default sha256 block hashes), in `--vllm-python` (`make
  vllm-manager-peer` builds .peer/vllm034: vllm 0.34.0);
- nano: nano-vllm's `BlockManager` and `Sequence` (`can_allocate`/`allocate`, `may_append`,
  `hash_blocks`, `deallocate`, as its scheduler calls them), from a checkout given as
  `--nano-vllm DIR` (its two modules loaded without the package's torch-importing __init__).

Timed per side (CPU and wall): building each request and its whole lifetime, not the token
ids. Printed: each side's times (range over the repeats), the ratios, and the check that every
side made the same decisions: the prefix-hit tokens of every request and the peak of pages held.

    .venv/bin/python benchmarks/manager_vs_vllm.py [--num-requests 6000] [--repeat 3]
        [--vllm-python .peer/vllm034/bin/python] [--nano-vllm DIR] [--page-size 16]
"""

from __future__ import annotations

import argparse
import array
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared/traces/azure2023_conv.csv"
NUM_PREFIXES = 8
VOCAB = 32000


# ------------------------------------------------------------------------------ lifetimes


def token_ids(seed: str, n: int) -> list[int]:
    """`n` token ids drawn from a generator seeded by `seed` (the same in every python)."""
    ids = array.array("H", random.Random(seed).randbytes(2 * n))
    return [token % VOCAB for token in ids]


def lifetimes(rows: list[list[int]], prefix_len: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, output ids) of each (prompt length, output length, shared prefix or -1)."""
    prefixes = [token_ids(f"prefix-{k}", prefix_len) for k in range(NUM_PREFIXES)]
    out = []
    for index, (prompt_len, output_len, prefix) in enumerate(rows):
        if prefix >= 0:
            prompt = prefixes[prefix] + token_ids(f"prompt-{index}", prompt_len - prefix_len)
        else:
            prompt = token_ids(f"prompt-{index}", prompt_len)
        out.append((prompt, token_ids(f"output-{index}", output_len)))
    return out


def rolling(n: int, batch: int, admit: Callable[[int], tuple], step: Callable[[list], None],
            free: Callable[[Any], object], used: Callable[[], int]) -> int:
    """Drive `n` lifetimes in a rolling batch: `admit(i)` -> (handle, decodes left),
    `step(active)` one decode of each, `free(handle)`; returns the peak of `used()` (taken
    after each step's admissions and decodes, before its frees)."""
    active: list = []
    finishing: dict[int, list] = {}
    next_index = step_index = peak = 0
    while next_index < n or active:
        while len(active) < batch and next_index < n:
            handle, num_decodes = admit(next_index)
            next_index += 1
            if num_decodes:
                active.append(handle)
                finishing.setdefault(step_index + num_decodes, []).append(handle)
            else:
                free(handle)
        step(active)
        peak = max(peak, used())
        step_index += 1
        for handle in finishing.pop(step_index, ()):
            active.remove(handle)
            free(handle)
    return peak


# ------------------------------------------------------------------------------ the sides


def kvlab_side(lives: list, args: argparse.Namespace) -> tuple:
    """kvlab's manager over the lifetimes: (peak pages held, hit tokens of each request).
    Each decode is `allocate(request, 1)`, as the vLLM side calls `allocate_slots` (its batch
    call, `allocate_decodes`, stops at every output page to register and was no faster here)."""
    from kvlab.policies import KVCacheManager, Request

    spec = f"paged:eviction=lru,block_size={args.page_size},watermark=0"
    manager = KVCacheManager(spec, args.num_pages, max_model_len=args.max_model_len)
    allocate, hits = manager.allocate, []
    outputs_of = [outputs for _, outputs in lives]

    def admit(index: int) -> tuple:
        prompt, outputs = lives[index]
        request = Request(index, len(prompt), len(outputs), prompt_token_ids=prompt,
                          output_ids_known=True)
        request.num_computed_tokens = hit = manager.num_computed_prefix_tokens(request)
        hits.append(hit)
        if allocate(request, len(prompt) - hit) is None:
            raise SystemExit("kvlab: out of KV pages; raise --num-pages")
        request.num_computed_tokens = len(prompt)
        request.output_token_ids.append(outputs[0])
        request.num_output_tokens = 1
        return request, len(outputs) - 1

    def step(active: list) -> None:
        for request in active:
            if allocate(request, 1) is None:
                raise SystemExit("kvlab: out of KV pages; raise --num-pages")
            request.num_computed_tokens += 1
            request.output_token_ids.append(
                outputs_of[request.request_id][request.num_output_tokens])
            request.num_output_tokens += 1

    peak = rolling(len(lives), args.batch, admit, step, manager.free,
                   lambda: manager.num_used_pages)
    return peak, hits


def vllm_side(lives: list, args: argparse.Namespace) -> tuple:
    """vLLM's KVCacheManager over the lifetimes (one more block: its null block)."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus

    hash_fn = get_hash_fn_by_name(args.vllm_hash)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(args.page_size, hash_fn)
    spec = FullAttentionSpec(block_size=args.page_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    config = KVCacheConfig(num_blocks=args.num_pages + 1, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    manager = KVCacheManager(config, args.max_model_len, scheduler_block_size=args.page_size,
                             hash_block_size=args.page_size, enable_caching=True)
    allocate, pool, hits = manager.allocate_slots, manager.block_pool, []
    num_blocks = args.num_pages

    def admit(index: int) -> tuple:
        prompt, outputs = lives[index]
        request = Request(str(index), prompt, SamplingParams(max_tokens=len(outputs)), None,
                          arrival_time=0.0, block_hasher=hasher)
        blocks, hit, _ = manager.get_computed_blocks(request)
        hits.append(hit)
        if allocate(request, len(prompt) - hit, hit, blocks) is None:
            raise SystemExit("vllm: out of KV blocks; raise --num-pages")
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = len(prompt)
        request.append_output_token_ids(outputs[0])
        return (request, outputs), len(outputs) - 1

    def step(active: list) -> None:
        for request, outputs in active:
            if allocate(request, 1) is None:
                raise SystemExit("vllm: out of KV blocks; raise --num-pages")
            request.num_computed_tokens += 1
            request.append_output_token_ids(outputs[request.num_output_tokens])

    peak = rolling(len(lives), args.batch, admit, step, lambda h: manager.free(h[0]),
                   lambda: num_blocks - pool.get_num_free_blocks())
    return peak, hits


def nano_side(lives: list, args: argparse.Namespace) -> tuple:
    """nano-vllm's BlockManager over the lifetimes, called as its scheduler calls it."""
    import types

    package = types.ModuleType("nanovllm")  # (its __init__ imports torch and the model)
    package.__path__ = [str(Path(args.nano_vllm) / "nanovllm")]
    sys.modules["nanovllm"] = package
    from nanovllm.engine.block_manager import BlockManager
    from nanovllm.engine.sequence import Sequence
    from nanovllm.sampling_params import SamplingParams

    Sequence.block_size = args.page_size
    manager, hits = BlockManager(args.num_pages, args.page_size), []

    def admit(index: int) -> tuple:
        prompt, outputs = lives[index]
        seq = Sequence(prompt, SamplingParams(max_tokens=len(outputs), ignore_eos=True))
        num_cached = manager.can_allocate(seq)
        if num_cached < 0:
            raise SystemExit("nano-vllm: out of KV blocks; raise --num-pages")
        manager.allocate(seq, num_cached)
        hits.append(seq.num_cached_tokens)
        seq.num_scheduled_tokens = len(seq) - seq.num_cached_tokens
        manager.hash_blocks(seq)  # (its postprocess of the prefill)
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0
        seq.append_token(outputs[0])
        return (seq, outputs), len(outputs) - 1

    def step(active: list) -> None:
        for seq, _ in active:  # its schedule()
            if not manager.can_append(seq):
                raise SystemExit("nano-vllm: out of KV blocks; raise --num-pages")
            seq.num_scheduled_tokens = 1
            manager.may_append(seq)
        for seq, outputs in active:  # its postprocess()
            manager.hash_blocks(seq)
            seq.num_cached_tokens += 1
            seq.num_scheduled_tokens = 0
            seq.append_token(outputs[seq.num_completion_tokens])

    peak = rolling(len(lives), args.batch, admit, step, lambda h: manager.deallocate(h[0]),
                   lambda: len(manager.used_block_ids))
    return peak, hits


SIDES = {"kvlab": kvlab_side, "vllm": vllm_side, "nano": nano_side}


def run_side(args: argparse.Namespace) -> None:
    """One side in this process: print its times, peak and hits as one JSON line."""
    rows = json.loads(Path(args.rows).read_text())
    lives = lifetimes(rows, args.prefix_len)
    side = SIDES[args.side]
    num_steps = sum(len(outputs) - 1 for _, outputs in lives)
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(side, lives, args)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)
        return
    start, start_cpu = time.perf_counter(), time.process_time()
    peak, hits = side(lives, args)
    cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
    print(json.dumps({"cpu": cpu, "wall": wall, "peak": peak, "hits": hits,
                      "steps": num_steps}))


# ------------------------------------------------------------------------------ the driver


def side_command(args: argparse.Namespace, side: str, rows: Path) -> list[str]:
    """The command line running `side` in its python."""
    python = args.vllm_python if side == "vllm" else sys.executable
    return [python, __file__, "--side", side, "--rows", str(rows), "--page-size",
            str(args.page_size), "--num-pages", str(args.num_pages), "--batch",
            str(args.batch), "--prefix-len", str(args.prefix_len), "--max-model-len",
            str(args.max_model_len), "--vllm-hash", args.vllm_hash,
            "--nano-vllm", str(args.nano_vllm)]


def trace_rows(args: argparse.Namespace) -> list[list[int]]:
    """(prompt length, output length, shared prefix or -1) of the first requests."""
    from kvlab.traces import load_azure

    rows = []
    for index, row in enumerate(load_azure(args.path).requests[: args.num_requests]):
        shared = index % 10 < round(10 * args.shared_fraction) and row.input_len > args.prefix_len
        prefix = index % NUM_PREFIXES if shared else -1
        rows.append([row.input_len, max(1, row.output_len), prefix])
    return rows


def compare(args: argparse.Namespace) -> None:
    """Run every side `--repeat` times in turn; print times, ratios and the decision check."""
    sides = ["kvlab", "vllm"] + (["nano"] if args.nano_vllm else [])
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as scratch:
        rows = Path(scratch) / "rows.json"
        rows.write_text(json.dumps(trace_rows(args)))
        for _ in range(args.repeat):
            for side in sides:
                done = subprocess.run(side_command(args, side, rows), capture_output=True,
                                      text=True, check=False)
                if done.returncode:
                    raise SystemExit(f"{side} side failed:\n{done.stderr[-3000:]}")
                results[side].append(json.loads(done.stdout.splitlines()[-1]))
    first = results["kvlab"][0]
    print(f"requests {args.num_requests:,}, page {args.page_size}, {args.num_pages:,} pages, "
          f"batch {args.batch}, decode token-steps {first['steps']:,}, "
          f"prefix-hit tokens {sum(first['hits']):,}")
    best = {}
    for side in sides:
        cpus = sorted(run["cpu"] for run in results[side])
        walls = sorted(run["wall"] for run in results[side])
        best[side] = cpus[0]
        print(f"{side:6} CPU {cpus[0]:6.2f}-{cpus[-1]:6.2f} s   wall {walls[0]:6.2f}-"
              f"{walls[-1]:6.2f} s   {cpus[0] / first['steps'] * 1e9:6.0f} ns CPU per "
              "token-step")
    for side in sides[1:]:
        print(f"{side} / kvlab (best CPU)  {best[side] / best['kvlab']:.1f}x")
    print("same decisions:")
    for side in sides[1:]:
        run = results[side][0]
        same_hits = sum(a == b for a, b in zip(run["hits"], first["hits"], strict=True))
        print(f"  {side}: prefix-hit tokens equal for {same_hits:,} of {len(first['hits']):,} "
              f"requests; peak pages held {run['peak']:,} ({side}) vs {first['peak']:,} (kvlab)")
    for side in sides:  # and every run of a side as its first
        if any((run["hits"], run["peak"]) != (results[side][0]["hits"], results[side][0]["peak"])
               for run in results[side]):
            print(f"  {side}: runs differ from one another")


def main() -> None:
    """Parse flags; run one side (`--side`) or compare them all."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=DEFAULT_TRACE, help="Azure conv trace CSV")
    parser.add_argument("--num-requests", type=int, default=6000)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--num-pages", type=int, default=131072)
    parser.add_argument("--batch", type=int, default=256, help="requests decoding together")
    parser.add_argument("--shared-fraction", type=float, default=0.3)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--vllm-python", default=str(ROOT / ".peer/vllm034/bin/python"))
    parser.add_argument("--vllm-hash", default="sha256", help="vLLM's prefix hash (its default)")
    parser.add_argument("--nano-vllm", default="", help="a nano-vllm checkout (else no nano)")
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=int, default=0,
                        help="with --side: print this many lines of its cProfile instead")
    args = parser.parse_args()
    if args.side:
        run_side(args)
        return
    if args.repeat < 1 or args.num_requests < 1:
        parser.error("--repeat and --num-requests: expected at least 1")
    if not args.path.is_file():
        parser.error(f"--path {args.path}: no such file; expected the Azure conv trace CSV")
    if not Path(args.vllm_python).is_file():
        parser.error(f"--vllm-python {args.vllm_python}: no such file; run `make "
                     "vllm-manager-peer`")
    if args.nano_vllm and not (Path(args.nano_vllm) / "nanovllm/engine/block_manager.py").is_file():
        parser.error(f"--nano-vllm {args.nano_vllm}: no nanovllm/engine/block_manager.py there")
    compare(args)


if __name__ == "__main__":
    main()
