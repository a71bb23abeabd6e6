"""Cluster simulation cost: CPU seconds of one trace on 1 instance (`simulate`) and on a cluster
of N instances (`simulate_cluster`, each router), Llama-2-7B on an A100-80GB, paged blocks of 16.

The same trace at the same rate: a cluster of 4 serves it with a quarter of the load on each
instance, so it takes more, smaller steps (fewer requests share each). Both rates are printed:
the trace as it is, and the trace N times faster on N instances (the same load per instance as
the single instance had). Times are the best of --repeat runs (CPU time of this process).

    .venv/bin/python benchmarks/cluster_bench.py [--path TRACE.csv] [--num-instances 4]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

DEFAULT_PATH = "/work/shared/traces/azure2023_conv.csv"


def measure(trace: Any, num_instances: int, router: str | None, repeat: int) -> dict[str, Any]:
    """Best CPU seconds of `repeat` runs, with the run's steps and output tokens."""
    from kvlab.metrics import summarize
    from kvlab.sim import SimConfig, simulate, simulate_cluster

    config = SimConfig(model="llama-2-7b", hardware="a100-80g")
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        if router is None:
            run = simulate(trace, config)
        else:
            run = simulate_cluster(trace, config, num_instances=num_instances,
                                   router=router).cluster
        best = min(best, time.process_time() - started)
    summary = summarize(run)
    return {"setup": "1 instance" if router is None else f"{num_instances} x {router}",
            "cpu_s": best, "steps": len(run.steps), "tokens": summary["total_output_tokens"],
            "mean_ttft_ms": summary["mean_ttft_ms"]}


def main() -> None:
    """Print one table per arrival rate."""
    from kvlab.sim import router_names
    from kvlab.traces import load_trace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=DEFAULT_PATH,
                        help="Azure-format trace (default: the full conversation trace; the "
                        "bundled excerpt when it is absent)")
    parser.add_argument("--num-instances", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = args.path if Path(args.path).exists() else None
    for scale in (1.0, float(args.num_instances)):
        trace = load_trace("azure", path, time_scale=scale)
        print(f"{trace.name}: {len(trace):,} requests, time scale {scale:g}")
        rows = [measure(trace, 1, None, args.repeat)]
        rows += [measure(trace, args.num_instances, router, args.repeat)
                 for router in router_names()]
        base = rows[0]["cpu_s"]
        print(f"{'setup':<22} {'cpu s':>7} {'x 1 inst':>8} {'steps':>9} {'out tokens':>11} "
              f"{'tok/cpu s':>10} {'mean TTFT ms':>12}")
        for row in rows:
            print(f"{row['setup']:<22} {row['cpu_s']:>7.2f} {row['cpu_s'] / base:>8.2f} "
                  f"{row['steps']:>9,} {row['tokens']:>11,} {row['tokens'] / row['cpu_s']:>10,.0f} "
                  f"{row['mean_ttft_ms']:>12.1f}")
        print()


if __name__ == "__main__":
    main()
