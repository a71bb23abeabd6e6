"""Memory tiers: what a run with tiers costs next to the same run without them (CPU time of
the simulation alone, the best of a few runs, the cases taken in turn) and the hit rates it
buys.

    .venv/bin/python benchmarks/tiers_bench.py [--repeats 3]

The run: the bundled Mooncake excerpt, Llama-3.1-8B on one H200 with prefix caching, with no
tier, a 256 GiB host tier, and host 256 GiB + 2 TiB SSD: with the default tier page size
(`auto`: 512 tokens on this trace, whose prefixes are shared in 512-token hash blocks), with
256-token tier pages (`/256`), with tier pages of one device page (16 tokens,
`--kv-tier-block-size none`, `/page` below), all written back, and 256-token pages written
through (`/wt`). Target (issue 51): host + SSD at
most 1.3x the CPU time of the same run without tiers, in pure Python. Printed: the best run's
CPU time, its ratio to the best run without tiers, and the median over the rounds of each
round's ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvlab.metrics import summarize
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import TiersConfig, parse_tiers
from kvlab.sim import SimConfig, simulate
from kvlab.traces import load_trace

CASES = ("", "host:256GiB", "host:256GiB,ssd:2TiB", "host:256GiB,ssd:2TiB/256", "host:256GiB/page",
         "host:256GiB,ssd:2TiB/page", "host:256GiB/256/wt", "host:256GiB,ssd:2TiB/256/wt")


def config(case: str) -> SimConfig:
    """Llama-3.1-8B on an H200 with prefix caching and the case's tiers (`TIERS[/BLOCK[/wt]]`:
    with tier pages of BLOCK tokens, or one device page for `page`, written back, or through
    with `/wt`; no BLOCK: the default size)."""
    tiers, _, rest = case.partition("/")
    block, _, through = rest.partition("/")
    settings: dict = {}
    if block:
        settings["block_size"] = None if block == "page" else int(block)
    if through:
        settings["write_policy"] = "write-through"
    serving = ServingConfig.create("paged", enable_prefix_caching=True,
                                   kv_tiers=TiersConfig(parse_tiers(tiers), **settings))
    return SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=serving)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trace = load_trace("mooncake")
    configs = {tiers: config(tiers) for tiers in CASES}
    times: dict[str, list[float]] = {tiers: [] for tiers in CASES}
    summaries: dict[str, dict] = {}
    for round_index in range(args.repeats):  # the cases in turn, so that drift hits all;
        order = CASES if round_index % 2 == 0 else CASES[::-1]  # each first as often
        for tiers in order:
            start = time.process_time()
            result = simulate(trace, configs[tiers])
            times[tiers].append(time.process_time() - start)
            summaries[tiers] = summarize(result)
    base = min(times[""])
    print(f"{'tiers[/tier page tokens]':<32}{'CPU s':>8}{'x none':>8}{'median x':>10}{'hit %':>8}"
          f"{'out tok/s':>11}")
    for tiers in CASES:
        summary, best = summaries[tiers], min(times[tiers])
        # a round's ratio compares runs minutes apart at most: on a shared machine whose
        # speed drifts, their median is steadier than the ratio of the best runs
        paired = statistics.median(t / n for t, n in zip(times[tiers], times[""], strict=True))
        print(f"{tiers or 'none':<32}{best:>8.2f}{best / base:>8.2f}{paired:>10.2f}"
              f"{summary['prefix_cache_hit_rate_perc']:>8.2f}{summary['output_throughput']:>11.1f}")


if __name__ == "__main__":
    main()
