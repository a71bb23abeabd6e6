"""Simulator speed: the full Azure conversation trace (19,366 requests, ~4.1M output tokens) through
Llama-2-7B on an A100-80GB, paged blocks of 16, replaying the trace's timestamps.

Prints, per trace fraction (first 1/8, 1/4, 1/2, all of the requests), the wall and CPU seconds
of `simulate`, simulated output tokens per wall second and per CPU second, engine steps, and the
peak RSS of the process. Each fraction runs in a fresh interpreter so its peak RSS is its own.
Targets for the full trace: at least 2M simulated output tokens per CPU second (issue 19), under
10 s and under 1 GB.

    .venv/bin/python benchmarks/sim_bench.py [--path TRACE.csv] [--fractions 0.125,0.25,0.5,1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_PATH = "/work/shared/traces/azure2023_conv.csv"
NUM_REQUESTS = 19_366  # rows of the full Azure conv trace
TARGET_TOKENS_PER_CPU_S = 2_000_000  # on the full trace (issue 19)


def measure(path: str, fraction: float) -> dict[str, float]:
    """Simulate the first `fraction` of the trace in this process and return the figures."""
    from kvlab.metrics import summarize
    from kvlab.sim import SimConfig, simulate
    from kvlab.traces import load_trace

    started = time.perf_counter()
    trace = load_trace("azure", path)
    num_prompts = max(1, round(len(trace) * fraction))
    trace.requests = trace.requests[:num_prompts]
    loaded = time.perf_counter()
    cpu = time.process_time()
    result = simulate(trace, SimConfig(model="llama-2-7b", hardware="a100-80g"))
    cpu_s = time.process_time() - cpu
    simulated = time.perf_counter()
    summary = summarize(result)
    summarized = time.perf_counter()
    sim_s = simulated - loaded
    tokens = summary["total_output_tokens"]
    return {
        "fraction": fraction,
        "num_requests": num_prompts,
        "output_tokens": tokens,
        "num_steps": len(result.steps),
        "load_s": loaded - started,
        "simulate_s": sim_s,
        "simulate_cpu_s": cpu_s,
        "summarize_s": summarized - simulated,
        "tokens_per_s": tokens / sim_s,
        "tokens_per_cpu_s": tokens / cpu_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _run_child(path: str, fraction: float) -> dict[str, float]:
    command = [sys.executable, __file__, "--path", path, "--child", str(fraction)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_table(rows: list[dict[str, float]]) -> None:
    header = (
        f"{'fraction':>8} {'requests':>9} {'out tokens':>11} {'steps':>8} {'load s':>7} "
        f"{'sim s':>7} {'sim cpu s':>9} {'sum s':>6} {'tok/s':>9} {'tok/cpu s':>9} {'RSS MB':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['fraction']:>8.3f} {r['num_requests']:>9,} {r['output_tokens']:>11,} "
            f"{r['num_steps']:>8,} {r['load_s']:>7.2f} {r['simulate_s']:>7.2f} "
            f"{r['simulate_cpu_s']:>9.2f} {r['summarize_s']:>6.2f} {r['tokens_per_s']:>9,.0f} "
            f"{r['tokens_per_cpu_s']:>9,.0f} "
            f"{r['peak_rss_mb']:>7.0f}"
        )


def main() -> None:
    """Run each fraction in a child interpreter and print the curve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH, help="Azure conv trace CSV")
    parser.add_argument("--fractions", default="0.125,0.25,0.5,1", help="comma-separated")
    parser.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.path, args.child)))
        return
    if not Path(args.path).is_file():
        parser.error(f"--path {args.path}: no such file; expected the Azure conv trace CSV")
    try:
        fractions = [float(f) for f in args.fractions.split(",")]
    except ValueError:
        fractions = []
    if not fractions or not all(0 < f <= 1 for f in fractions):
        parser.error(f"--fractions {args.fractions}: expected comma-separated numbers in (0, 1]")
    print(f"trace {args.path}; llama-2-7b on a100-80g, paged block 16, timestamps replayed")
    rows = [_run_child(args.path, fraction) for fraction in fractions]
    _print_table(rows)
    full = rows[-1]
    fast = full["tokens_per_cpu_s"] >= TARGET_TOKENS_PER_CPU_S
    small = full["simulate_s"] < 10 and full["peak_rss_mb"] < 1024
    print(
        f"largest fraction: {full['simulate_cpu_s']:.2f} s CPU, {full['tokens_per_cpu_s']:,.0f} "
        f"simulated output tokens per CPU second ({'meets' if fast else 'misses'} the "
        f"{TARGET_TOKENS_PER_CPU_S / 1e6:.0f}M target); {full['simulate_s']:.2f} s wall, "
        f"{full['peak_rss_mb']:.0f} MB peak RSS ({'meets' if small else 'misses'} the "
        "10 s / 1 GB target)"
    )


if __name__ == "__main__":
    main()
