"""kvlab's engine versus transformers' `generate` on one random-weight Llama checkpoint.

Both load the same safetensors folder (written by transformers into a temporary directory) and
serve the same mixed-length requests greedily. transformers runs the usual batched `generate`:
left padding, one `max_new_tokens` for the whole batch (the longest request's), each output
then cut to its request's length. kvlab runs continuous batching over a paged KV cache, each
request stopping at its own length. Printed: useful output tokens/s for both (wall clock), the
ratio, whether the greedy outputs are identical, and KV memory allocated versus holding tokens.

    .venv/bin/python benchmarks/engine_bench.py            # 64 requests, hidden 1024, 8 layers
    .venv/bin/python benchmarks/engine_bench.py --threads 1 --num-layers 4
    python benchmarks/engine_bench.py --device cuda --dtype bfloat16 --attention-backend triton

Outputs must be identical in float32 (exit 1 otherwise); in bfloat16 or float16 the two sides'
kernels round differently, so a greedy path may part at a near tie: counted, not failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args() -> argparse.Namespace:
    """The benchmark's knobs (model shape, workload, threads)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--lengths", choices=("azure", "uniform"), default="azure",
                   help="azure: the real lengths of the first requests of the bundled Azure "
                        "conversation excerpt that fit --input-len and --output-len maxima; "
                        "uniform: lengths drawn uniformly from those ranges")
    p.add_argument("--input-len", type=int, nargs=2, default=(16, 512), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    p.add_argument("--hidden-size", type=int, default=1024)
    p.add_argument("--intermediate-size", type=int, default=2816)
    p.add_argument("--num-layers", type=int, default=8)
    p.add_argument("--num-heads", type=int, default=16)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--policy", default="paged", help="kvlab policy spec")
    p.add_argument("--kv-cache-memory", default="1GiB", help="kvlab KV cache size")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-hf", action="store_true", help="time kvlab only")
    p.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                   help="weights and KV of both sides")
    p.add_argument("--attention-backend", default="torch", help="kvlab's kernels: torch, triton")
    return p.parse_args()


def save_model(folder: Path, args: argparse.Namespace) -> int:
    """A random Llama saved by transformers as safetensors; returns its size in bytes."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=4096,
        eos_token_id=None,  # both sides generate exactly the requested lengths
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[args.dtype])
    model.save_pretrained(folder, safe_serialization=True)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def workload(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    """Prompts (random ids) and output lengths, by --lengths (see its help)."""
    rng = np.random.default_rng(args.seed)
    if args.lengths == "azure":
        from kvlab.traces import load_trace

        (min_in, max_in), (min_out, max_out) = args.input_len, args.output_len
        fits = [
            r
            for r in load_trace("azure").requests
            if min_in <= r.input_len <= max_in and min_out <= r.output_len <= max_out
        ][: args.num_requests]
        if len(fits) < args.num_requests:
            raise SystemExit(f"only {len(fits)} excerpt requests fit the length ranges")
        input_lens = [r.input_len for r in fits]
        output_lens = [r.output_len for r in fits]
    else:
        input_lens = rng.integers(args.input_len[0], args.input_len[1] + 1, args.num_requests)
        output_lens = rng.integers(args.output_len[0], args.output_len[1] + 1, args.num_requests)
    prompts = [rng.integers(3, args.vocab_size, int(n)).tolist() for n in input_lens]
    return prompts, [int(n) for n in output_lens]


def run_kvlab(folder: Path, prompts, output_lens, args) -> tuple[list[list[int]], float, dict]:
    """kvlab's greedy outputs, its Timer, and KV memory figures."""
    from kvlab.engine import LLM, SamplingParams

    llm = LLM(
        str(folder),
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        policy=args.policy,
        kv_cache_memory=args.kv_cache_memory,
        max_num_batched_tokens=args.max_num_batched_tokens,
        verbose=True,
    )
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    with Timer() as timer:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    steps = llm.last_run.steps.columns
    engine = llm.engine
    page_bytes = engine.kv_cache.num_bytes // engine.num_pages
    peak = int(np.argmax(steps["num_used_pages"]))
    memory = {
        "allocated_bytes": engine.kv_cache.num_bytes,
        "peak_held_bytes": steps["num_used_pages"][peak] * page_bytes,
        "peak_live_bytes": steps["num_live_token_slots"][peak] * page_bytes // engine.page_size,
        "num_steps": len(steps["step_id"]),
    }
    return [o.outputs[0].token_ids for o in outputs], timer, memory


def run_hf(folder: Path, prompts, output_lens, args) -> tuple[list[list[int]], float, dict]:
    """transformers' batched greedy generate (left padding), cut to each request's length."""
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(args.device).eval()
    model.generation_config.eos_token_id = None
    pad = 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=args.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        device=args.device)
    max_new = max(output_lens)
    with torch.inference_mode():
        model.generate(ids[:2, -8:], attention_mask=mask[:2, -8:], do_sample=False,
                       max_new_tokens=2, pad_token_id=pad)  # warm-up
        with Timer() as timer:
            generated = model.generate(ids, attention_mask=mask, do_sample=False,
                                       max_new_tokens=max_new, pad_token_id=pad)
            generated = generated.cpu()  # waits for the device's last kernels
    outputs = [generated[i, width : width + n].tolist() for i, n in enumerate(output_lens)]
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    token_bytes = (2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
                   * dtype.itemsize)
    # the cache holds every padded position of every row: prompt width + generated - 1
    held = len(prompts) * (width + max_new - 1) * token_bytes
    live = sum(len(p) + n - 1 for p, n in zip(prompts, output_lens, strict=True)) * token_bytes
    return outputs, timer, {"held_bytes": held, "live_bytes": live, "max_new_tokens": max_new}


class Timer:
    """Wall and CPU seconds of a block; CPU time is what a machine shared with other jobs
    does not inflate (with one torch thread it is the work done)."""

    def __enter__(self) -> Timer:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu

    def rates(self, num_tokens: int) -> str:
        """Tokens per wall second and per CPU second."""
        return (f"{self.wall_s:.1f} s wall ({num_tokens / self.wall_s:.1f} output tok/s), "
                f"{self.cpu_s:.1f} s cpu ({num_tokens / self.cpu_s:.1f} output tok/cpu-s)")


def mib(num_bytes: float) -> str:
    """Bytes as MiB with one decimal."""
    return f"{num_bytes / 2**20:,.1f} MiB"


def main() -> int:
    """Run both, print the comparison; exit 1 when the greedy outputs differ."""
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    prompts, output_lens = workload(args)
    useful = sum(output_lens)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__} on {where}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    lens = [len(p) for p in prompts]
    print(f"{len(prompts)} requests ({args.lengths} lengths): prompts {min(lens)}-{max(lens)} "
          f"tokens (sum {sum(lens):,}), outputs {min(output_lens)}-"
          f"{max(output_lens)} tokens (sum {useful:,})")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = save_model(folder, args)
        print(f"model: random Llama, hidden {args.hidden_size}, {args.num_layers} layers, "
              f"{args.num_heads} heads / {args.num_kv_heads} KV heads, vocab {args.vocab_size}, "
              f"{args.dtype}, {mib(size)} of safetensors")
        kv_tokens, kv_time, kv_mem = run_kvlab(folder, prompts, output_lens, args)
        print(f"kvlab ({args.policy}, {args.attention_backend} kernels, {kv_mem['num_steps']} "
              f"steps): {kv_time.rates(useful)}")
        print(f"  KV: {mib(kv_mem['allocated_bytes'])} allocated; at the peak "
              f"{mib(kv_mem['peak_held_bytes'])} held by requests, "
              f"{mib(kv_mem['peak_live_bytes'])} of it real tokens "
              f"({100 * kv_mem['peak_live_bytes'] / kv_mem['peak_held_bytes']:.1f}%)")
        if args.skip_hf:
            return 0
        hf_tokens, hf_time, hf_mem = run_hf(folder, prompts, output_lens, args)
    print(f"transformers (one batched generate, left padding, max_new_tokens "
          f"{hf_mem['max_new_tokens']}, outputs cut per request): {hf_time.rates(useful)}")
    print(f"  KV: {mib(hf_mem['held_bytes'])} held at the end, {mib(hf_mem['live_bytes'])} of "
          f"it real tokens ({100 * hf_mem['live_bytes'] / hf_mem['held_bytes']:.1f}%)")
    print(f"throughput ratio kvlab / transformers: {hf_time.wall_s / kv_time.wall_s:.2f}x wall, "
          f"{hf_time.cpu_s / kv_time.cpu_s:.2f}x cpu")
    same = [a == b for a, b in zip(kv_tokens, hf_tokens, strict=True)]
    print(f"identical greedy outputs: {sum(same)} / {len(same)} requests")
    for index, (a, b) in enumerate(zip(kv_tokens, hf_tokens, strict=True)):
        if a != b:
            first = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            print(f"  request {index}: first difference at output token {first}")
    return 0 if all(same) or args.dtype != "float32" else 1


if __name__ == "__main__":
    sys.exit(main())
