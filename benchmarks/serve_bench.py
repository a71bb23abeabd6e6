"""`kvlab serve` against offline `LLM.generate` on the same model and requests.

Saves a random Llama (transformers, fp32) to a temporary folder, then:
1. offline: `LLM.generate` of all requests at once (greedy, eos ignored): output tokens/s;
2. served: the same requests from as many loopback clients (httpx, non-streaming; fewer with
   `--concurrency`, then batches are smaller than offline) to a `kvlab serve` subprocess:
   output tokens/s, and the ratio to offline (target >= 0.90);
3. added latency: `--num-latency` requests one at a time, each through HTTP and offline; the
   difference per request, p50 and p99 in ms (what the HTTP path costs a lone request).
Offline and served runs alternate `--repeat` times (the machine's speed drifts): best and median.

    .venv/bin/python benchmarks/serve_bench.py [--num-requests 128] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np


def save_model(folder: Path, hidden: int, layers: int, vocab: int) -> None:
    """A random Llama of the given shape, saved as safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64,
                         num_key_value_heads=max(1, hidden // 256),
                         max_position_embeddings=2048)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)


def workload(num: int, max_tokens: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(32, 256))] for _ in range(num)]


def offline(llm: object, params: object, prompts: list[list[int]]) -> float:
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)  # type: ignore[attr-defined]
    return time.perf_counter() - start


async def served(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> float:
    limits = httpx.Limits(max_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:
        async def one(prompt: list[int]) -> None:
            async with gate:
                response = await client.post("/v1/completions", json={
                    "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True})
                response.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts))
        return time.perf_counter() - start


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(folder: Path, port: int, *extra: str) -> subprocess.Popen:
    """`kvlab serve FOLDER` (1 GiB of KV, `extra` flags) on `port`, once it answers /health."""
    command = [sys.executable, "-c", "from kvlab.cli import main; raise SystemExit(main())",
               "serve", str(folder), "--port", str(port), "--kv-cache-memory", "1GiB", *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=tempfile.gettempdir())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("kvlab serve did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=None,
                        help="clients at once (default: every request, as offline)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--num-latency", type=int, default=30)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=4)
    args = parser.parse_args()
    concurrency = args.concurrency or args.num_requests
    vocab = 4096
    from kvlab.engine import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        save_model(folder, args.hidden_size, args.num_layers, vocab)
        prompts = workload(args.num_requests, args.max_tokens, vocab)
        llm = LLM(str(folder), verbose=False, kv_cache_memory="1GiB")
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        offline(llm, params, prompts[:2])  # warm-up
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_server(folder, port)
        try:
            asyncio.run(served(url, prompts[:2], args.max_tokens, 2))  # warm-up
            offline_s, served_s = [], []
            for _ in range(args.repeat):
                offline_s.append(offline(llm, params, prompts))
                served_s.append(asyncio.run(served(url, prompts, args.max_tokens, concurrency)))
            added = []
            for prompt in prompts[: args.num_latency]:
                start = time.perf_counter()
                httpx.post(url + "/v1/completions", timeout=600, json={
                    "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
                    "ignore_eos": True}).raise_for_status()
                http_s = time.perf_counter() - start
                start = time.perf_counter()
                llm.generate([prompt], params, use_tqdm=False)
                added.append(http_s - (time.perf_counter() - start))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    tokens = args.num_requests * args.max_tokens
    print(f"model: random Llama, hidden {args.hidden_size}, {args.num_layers} layers, fp32, cpu "
          f"({os.cpu_count()} cores)")
    print(f"requests: {args.num_requests} of 32-256 prompt tokens, {args.max_tokens} output "
          f"tokens each; {concurrency} concurrent clients; {args.repeat} alternated runs")
    best_off, best_srv = min(offline_s), min(served_s)
    ratios = [o / s for o, s in zip(offline_s, served_s, strict=True)]
    print(f"{'offline LLM.generate (tok/s), best':<36}{tokens / best_off:>10.1f}")
    print(f"{'kvlab serve (tok/s), best':<36}{tokens / best_srv:>10.1f}")
    print(f"{'serve / offline, best':<36}{best_off / best_srv:>10.2f}   (target >= 0.90)")
    print(f"{'serve / offline, each pair':<36}{'  '.join(f'{r:.2f}' for r in ratios):>10}")
    p50, p99 = np.percentile(np.array(added) * 1000, [50, 99])
    print(f"{'added latency of HTTP, p50 (ms)':<36}{p50:>10.1f}")
    print(f"{'added latency of HTTP, p99 (ms)':<36}{p99:>10.1f}")


if __name__ == "__main__":
    main()
