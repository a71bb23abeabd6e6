"""Sweep overhead: a 200-run sweep on the local process pool and on a local Ray instance of the
same number of workers (2 by default), the same rows from both.

The runs: the bundled Azure conversation excerpt cut to its first 300 requests, Llama-2-7B on
an A100-80GB, over 5 policies x 4 block sizes x 2 batch limits x 5 time scales (200 runs of
about a tenth of a CPU-second each). For each executor it prints the wall time, the runs' own
CPU time (the sum of each row's `run_cpu_s`: loading the trace, simulating, summarizing, in the
worker) and the sweep's overhead as a share of it:

- cpu overhead: (CPU of this process and every process under it, the workers and Ray's own
  daemons, read from /proc) minus the runs' own CPU, over the runs' own CPU, everything
  included: the executor's start-up (pool fork; `ray.init`) and each worker's first runs;
- steady cpu: the same after every worker's first run (the sweep resumed, skipping those);
- steady wall: wall time x workers minus the runs' own CPU, over it, after the first runs
  (idle workers count, and so does other processes' load on a shared machine).

Rows are compared without `run_cpu_s`. Target: CPU overhead per run < 5% of its own CPU.

Then, in this process, a run's own CPU split into its parts over the first `--split-runs`
points, each run's parts in turn (milliseconds per run): building its config, loading its
trace (kept between runs since issue 52: `kvlab.sweep.trace_cache`), simulating, summarizing,
and what `run_point` adds (its row); all that is not simulating is a run's overhead.

    .venv/bin/python benchmarks/sweep_bench.py [--workers 2] [--num-prompts 300] [--rounds 2]
        [--executors local,ray] [--split-runs 40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
POLICIES = ["paged", "paged:preemption=swap", "buddy:block_sizing=geometric",
            "contiguous:reserve=pow2", "contiguous:reserve=oracle"]
GRID = {"policy": POLICIES, "block_size": [16, 32, 64, 128], "max_num_seqs": [64, 256],
        "time_scale": [2, 4, 8, 16, 32]}


def _descendants_cpu_s(root: int) -> tuple[float, int]:
    """CPU seconds (user + system, their reaped children's included) of every process under
    `root`, and how many there are."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(v) for v in fields[11:15]) / CLOCK_TICKS
    under, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        under.update(children)
        frontier.extend(children)
    return sum(times[pid] for pid in under), len(under)


def _cpu_now() -> tuple[float, int]:
    own = time.process_time()
    below, count = _descendants_cpu_s(os.getpid())
    return own + below, count


def measure(executor_name: str, points: list[dict[str, Any]], workers: int,
            folder: Path) -> dict[str, Any]:
    """Sweep `points` into `folder` on one executor, in two parts: the first `slots` points
    (every worker's first runs: starting and importing kvlab), then the whole sweep again,
    which skips those as stored and runs the rest (the steady state). The figures and rows."""
    from kvlab.sweep import SweepStore, make_executor, run_sweep

    store = SweepStore(folder)
    cpu = [_cpu_now()[0]]
    wall = [time.perf_counter()]
    executor = make_executor(executor_name, workers=workers)
    try:
        cpu.append(_cpu_now()[0])
        wall.append(time.perf_counter())
        first = run_sweep(points[:executor.slots], store, executor)
        cpu.append(_cpu_now()[0])
        wall.append(time.perf_counter())
        rest = run_sweep(points, store, executor)
        end_cpu, num_processes = _cpu_now()  # before close: the workers still run
        cpu.append(end_cpu)
        wall.append(time.perf_counter())
    finally:
        executor.close()
    own = first.run_cpu_s + rest.run_cpu_s
    return {
        "executor": executor_name,
        "runs": first.num_run + rest.num_run,
        "errors": first.num_errors + rest.num_errors,
        "wall_s": wall[3] - wall[0],
        "startup_wall_s": wall[2] - wall[0],
        "run_cpu_s": own,
        "cpu_overhead": (cpu[3] - cpu[0] - own) / own,
        "steady_cpu_overhead": (cpu[3] - cpu[2] - rest.run_cpu_s) / rest.run_cpu_s,
        "steady_wall_overhead": ((wall[3] - wall[2]) * workers - rest.run_cpu_s)
        / rest.run_cpu_s,
        "processes": num_processes,
        "rows": store.read(),
    }


def comparable(frame: Any) -> list[dict[str, Any]]:
    """Rows without the timing columns, sorted by run key, nulls as None."""
    from kvlab.sweep import TIMING_COLUMNS

    frame = frame.drop(columns=list(TIMING_COLUMNS)).sort_values("run_key")
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def run_split(points: list[dict[str, Any]]) -> dict[str, float]:
    """Milliseconds per run of each part of `run_point`'s work over `points` (after one
    warm-up run): config, trace, simulate, summarize, and the rest of run_point (its row)."""
    from kvlab.metrics import summarize
    from kvlab.sim import simulate
    from kvlab.sweep.runner import load_settings_trace, run_point, sim_config, summary_options

    run_point(points[0])
    parts = dict.fromkeys(("config", "trace", "simulate", "summarize", "row"), 0.0)
    for point in points:
        clock = [time.process_time()]
        config = sim_config(point)
        clock.append(time.process_time())
        trace = load_settings_trace(point)
        clock.append(time.process_time())
        result = simulate(trace, config)
        clock.append(time.process_time())
        summarize(result, **summary_options(point))
        clock.append(time.process_time())
        whole = run_point(point)["run_cpu_s"]
        for name, start, end in zip(parts, clock, clock[1:], strict=False):
            parts[name] += end - start
        parts["row"] += whole - (clock[-1] - clock[0])
    return {name: 1000 * total / len(points) for name, total in parts.items()}


def main() -> None:
    """Run the sweep on both executors, alternately, and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="workers of each executor")
    parser.add_argument("--num-prompts", type=int, default=300, help="requests of each run")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each executor runs the sweep, alternately")
    parser.add_argument("--executors", default="local,ray", help="comma-separated")
    parser.add_argument("--split-runs", type=int, default=40,
                        help="points whose run CPU is split into its parts (0: none)")
    args = parser.parse_args()
    executors = [name for name in args.executors.split(",") if name]
    if not executors or any(name not in ("local", "ray") for name in executors):
        parser.error(f"--executors {args.executors}: expected local, ray or both")

    from kvlab.sweep import SweepSpec

    spec = SweepSpec.create({"num_prompts": args.num_prompts}, GRID)
    points = spec.points()
    folder = Path(tempfile.mkdtemp(prefix="kvlab-sweep-bench-"))
    try:
        results = [measure(name, points, args.workers, folder / f"{name}-{round_}")
                   for round_ in range(args.rounds) for name in executors]
    finally:
        shutil.rmtree(folder)
    print(f"{len(points)} runs of {args.num_prompts} Azure conv requests, {args.workers} "
          "workers each; overheads as shares of the runs' own CPU time")
    header = (f"{'executor':>8} {'runs':>5} {'errors':>6} {'wall s':>7} {'start s':>7} "
              f"{'run cpu s':>9} {'cpu overhead':>12} {'steady cpu':>10} {'steady wall':>11}"
              f" {'processes':>9}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['executor']:>8} {r['runs']:>5} {r['errors']:>6} {r['wall_s']:>7.1f} "
              f"{r['startup_wall_s']:>7.1f} {r['run_cpu_s']:>9.1f} {r['cpu_overhead']:>12.1%} "
              f"{r['steady_cpu_overhead']:>10.1%} {r['steady_wall_overhead']:>11.1%} "
              f"{r['processes']:>9}")
    reference = comparable(results[0]["rows"])
    for r in results[1:]:
        print(f"rows of {r['executor']} equal the first {results[0]['executor']}'s (without "
              f"run_cpu_s): {comparable(r['rows']) == reference} ({len(r['rows'])} rows)")
    if args.split_runs > 0:
        split = run_split(points[:args.split_runs])
        whole = sum(split.values())
        print(f"a run's own CPU, ms per run over {min(args.split_runs, len(points))} points: "
              + ", ".join(f"{name} {ms:.2f}" for name, ms in split.items())
              + f"; all but simulate: {whole - split['simulate']:.2f} of {whole:.2f} "
              f"({(whole - split['simulate']) / whole:.1%})")


if __name__ == "__main__":
    main()
