"""Memory tiers: what a run with tiers costs next to the same run without them (CPU time of
the simulation alone, the best of a few runs, the cases taken in turn) and the hit rates it
buys.

    .venv/bin/python benchmarks/tiers_bench.py [--repeats 3]

The run: the bundled Mooncake excerpt, Llama-3.1-8B on one H200 with prefix caching, with no
tier, a 256 GiB host tier, and host 256 GiB + 2 TiB SSD. Target (issue 18): a run with tiers
costs at most 1.5x the CPU time of the same run without them.
"""

from __future__ import annotations

import argparse
import time

from kvlab.metrics import summarize
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import TiersConfig, parse_tiers
from kvlab.sim import SimConfig, simulate
from kvlab.traces import load_trace

CASES = ("", "host:256GiB", "host:256GiB,ssd:2TiB")


def config(tiers: str) -> SimConfig:
    """Llama-3.1-8B on an H200 with prefix caching and the given tiers."""
    serving = ServingConfig.create("paged", enable_prefix_caching=True,
                                   kv_tiers=TiersConfig(parse_tiers(tiers)))
    return SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=serving)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trace = load_trace("mooncake")
    configs = {tiers: config(tiers) for tiers in CASES}
    best = dict.fromkeys(CASES, float("inf"))
    summaries: dict[str, dict] = {}
    for _ in range(args.repeats):  # the cases in turn, so that the machine's drift hits all
        for tiers, cfg in configs.items():
            start = time.process_time()
            result = simulate(trace, cfg)
            best[tiers] = min(best[tiers], time.process_time() - start)
            summaries[tiers] = summarize(result)
    base = best[""]
    print(f"{'tiers':<24}{'CPU s':>8}{'x none':>8}{'hit %':>8}{'out tok/s':>11}")
    for tiers in CASES:
        summary = summaries[tiers]
        print(f"{tiers or 'none':<24}{best[tiers]:>8.2f}{best[tiers] / base:>8.2f}"
              f"{summary['prefix_cache_hit_rate_perc']:>8.2f}{summary['output_throughput']:>11.1f}")


if __name__ == "__main__":
    main()
