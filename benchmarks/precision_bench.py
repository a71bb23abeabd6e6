"""What demotion costs the simulator (issue 48's target: a run with demotion on costs at most
1.3x the CPU time of the same run without).

For each workload, the same `simulate` call with the precision policy `none` and with each
demoting policy, in turn, `--repeats` times (trace loaded once, outside the timing); prints
each policy's CPU seconds (min-max over repeats), engine steps, and the ratio to `none` of the
same repeat (min-max and median; the target is read off the median). Each policy runs once
untimed first (imports and caches: the first run took up to 2.5x a later one), and garbage is
collected before each timed run. CPU time of this process only (`time.process_time`): other
processes on the machine slow it less than wall time, not at all in principle.

    .venv/bin/python benchmarks/precision_bench.py [--repeats 3] [--workloads mooncake,azure]
        [--eviction lru,arc]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

AZURE = "/work/shared/traces/azure2023_conv.csv"
DEMOTING = ("age:recent=512,depth=2", "age:recent=128,depth=1")
TARGET_RATIO = 1.3
# (trace arguments, SimConfig settings): the docs' runs (docs/kv_precision.md and
# docs/experiments/mixed_precision.md)
WORKLOADS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "mooncake": ({"name": "mooncake"},
                 {"model": "llama-3.1-8b", "hardware": "a100-80g",
                  "kv_cache_memory_bytes": 4 << 30}),
    "mooncake-h200": ({"name": "mooncake", "request_rate": 2.0},
                      {"model": "llama-3.1-8b", "hardware": "h200-141g"}),
    "azure": ({"name": "azure", "path": AZURE, "num_prompts": 2000, "request_rate": 20.0},
              {"model": "llama-3.1-8b", "hardware": "h200-141g"}),
}


def run_once(trace: Any, settings: dict[str, Any], precision: str, eviction: str = "lru"
             ) -> tuple[float, int]:
    """CPU seconds of one `simulate` of `trace` with `precision` and `eviction`, and its
    engine steps."""
    from kvlab.policies.serving import ServingConfig
    from kvlab.sim import SimConfig, simulate

    policy = f"paged:eviction={eviction}" + (
        "" if precision == "none" else f",precision={precision}")
    memory = {k: v for k, v in settings.items() if k == "kv_cache_memory_bytes"}
    serving = ServingConfig.create(policy, enable_prefix_caching=True, **memory)
    config = SimConfig(model=settings["model"], hardware=settings["hardware"], serving=serving)
    gc.collect()  # (the garbage of the run before is not this run's to collect)
    started = time.process_time()
    result = simulate(trace, config)
    return time.process_time() - started, len(result.steps)


def bench(name: str, repeats: int, eviction: str = "lru") -> None:
    """One workload's table, with the eviction policy `eviction`."""
    import copy

    from kvlab.traces import load_trace

    trace_args, settings = WORKLOADS[name]
    args = dict(trace_args)
    trace = load_trace(args.pop("name"), args.pop("path", None), **args)
    policies = ("none", *DEMOTING)
    cpu: dict[str, list[float]] = {p: [] for p in policies}
    steps: dict[str, int] = {}
    for precision in policies:  # (untimed: the first run of each imports and builds more)
        run_once(copy.deepcopy(trace), settings, precision, eviction)
    for _ in range(repeats):
        for precision in policies:  # in turn: drift on a shared machine hits all alike
            seconds, steps[precision] = run_once(copy.deepcopy(trace), settings, precision,
                                                 eviction)
            cpu[precision].append(seconds)
    print(f"{name}: {len(trace)} requests, {settings}, eviction={eviction}, {repeats} repeats")
    print(f"  {'precision':<26} {'CPU s (min-max)':>16} {'steps':>8} {'ratio to none':>16} "
          f"{'median':>7}")
    for precision in policies:
        ratios = [a / b for a, b in zip(cpu[precision], cpu["none"], strict=True)]
        median = statistics.median(ratios)
        print(f"  {precision:<26} {min(cpu[precision]):>7.2f}-{max(cpu[precision]):<8.2f} "
              f"{steps[precision]:>8,} {min(ratios):>7.2f}-{max(ratios):<8.2f} {median:>7.2f}"
              + ("" if precision == "none" or median <= TARGET_RATIO
                 else f"  above the {TARGET_RATIO}x target"))


def main() -> None:
    """Parse the flags and print each workload's table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--eviction", default="lru",
                        help="comma-separated eviction policies, a table each (kvlab policies; "
                        "default lru)")
    args = parser.parse_args()
    from kvlab.policies import registry

    workloads, evictions = args.workloads.split(","), args.eviction.split(",")
    for flag, names, valid in (("--workloads", workloads, list(WORKLOADS)),
                               ("--eviction", evictions, registry.names("eviction"))):
        unknown = [name for name in names if name not in valid]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)}; valid: {', '.join(valid)}")
    if args.repeats < 1:
        parser.error("--repeats: expected a whole number >= 1")
    for eviction in evictions:
        for name in workloads:
            bench(name, args.repeats, eviction)


if __name__ == "__main__":
    main()
