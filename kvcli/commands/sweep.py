"""`kvlab sweep`: simulate every point of a grid (or a random sample of it) and append one row
per run to a Parquet dataset, on a local process pool or a Ray cluster.

Every `kvlab sim` flag sets that setting for every run; `--grid KEY=V1,V2` (or a YAML file's
`grid:`) varies any of them, by the flag's name without the dashes, and the policy's own keys
(eviction, preemption, ..., precision). `kvlab tune` shares these flags.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.cli.commands.common import (
    add_cluster_arguments,
    add_machine_arguments,
    add_report_arguments,
    add_serving_arguments,
    add_workload_arguments,
    show_progress,
)

if TYPE_CHECKING:
    from kvlab.sweep import Executor, SweepSpec

# headline metrics printed for each run after a sweep (--show)
SHOWN = ("output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
         "num_preemptions", "kv_token_state_perc")


def add_spec_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """The sweep file, --grid and --sample flags, the executor's flags, and every `kvlab sim`
    flag as a setting of every run (`what`: 'run' or 'candidate')."""
    parser.add_argument("file", nargs="?", default=None, metavar="SWEEP.yaml",
                        help="YAML with `base:` (settings of every run), `grid:` (setting: "
                        "[values]) and optionally `sample:` and `sample_seed:`; the flags "
                        "below add to it")
    spec = parser.add_argument_group("grid")
    spec.add_argument("--grid", action="append", default=None, metavar="KEY=V1,V2",
                      help=f"vary a setting: every {what} takes each value (a `kvlab sim` "
                      "flag's name without the dashes, e.g. max_num_seqs=64,128, or a policy "
                      "key, e.g. eviction=lru,fifo); repeat for more settings")
    spec.add_argument("--sample", type=int, default=None, metavar="N",
                      help=f"run N {what}s drawn at random from the grid, without "
                      "replacement (default: the whole grid)")
    spec.add_argument("--sample-seed", type=int, default=None,
                      help="seed of --sample's draw (default 0)")
    where = parser.add_argument_group("execution")
    where.add_argument("--executor", choices=("local", "ray"), default="local",
                       help="local: a process pool on this machine; ray: Ray tasks, on a "
                       "local Ray instance or the cluster at --address (default local)")
    where.add_argument("--workers", type=int, default=None,
                       help="processes (local) or CPUs of a local Ray instance (default: one "
                       "per core; 1 runs in this process)")
    where.add_argument("--address", default=None, metavar="auto|HOST:PORT",
                       help="the Ray cluster to run on: auto for the one `ray start` runs on "
                       "this machine, or its head's HOST:PORT (default: start a local one)")
    where.add_argument("--force", action="store_true",
                       help="simulate every run again, replacing stored rows")
    where.add_argument("--retry-failed", action="store_true",
                       help="simulate again the runs whose stored row is an error")
    _add_sim_settings(parser)


def _add_sim_settings(parser: argparse.ArgumentParser) -> None:
    """`kvlab sim`'s flags, set only when given: each is a setting of every run."""
    before = len(parser._actions)
    add_workload_arguments(
        parser.add_argument_group("workload (every run; --grid varies any of these)"),
        num_prompts=None, num_prompts_help="keep the first N requests (random: generate N, "
        "default 1000)", seed_help="seed of resampled arrivals and synthetic lengths "
        "(default 0)")
    machine = parser.add_argument_group("model, hardware and memory (every run)")
    add_machine_arguments(machine)
    add_serving_arguments(parser.add_argument_group("policy and scheduler (every run)"),
                          machine)
    add_report_arguments(parser.add_argument_group("report (every run)"), files=False)
    add_cluster_arguments(parser.add_argument_group("cluster (every run)"))
    for action in parser._actions[before:]:
        if action.dest != "disable_tqdm":
            action.default = argparse.SUPPRESS


def sweep_spec(args: argparse.Namespace) -> SweepSpec:
    """The SweepSpec of the file and the flags; a flag wins over the file: a setting given
    as a flag replaces the file's base value and grid values of that setting, a --grid the
    file's grid values."""
    from kvlab.errors import KvlabError
    from kvlab.sweep import SETTINGS, SweepSpec, load_sweep_file, parse_grid_item

    spec = load_sweep_file(args.file) if args.file else SweepSpec()
    base = {name: value for name, value in vars(args).items() if name in SETTINGS}
    grid: dict[str, list[Any]] = {}
    for item in args.grid or []:
        try:
            name, values = parse_grid_item(item)
        except KvlabError as err:
            raise KvlabError(f"--grid {item}: {err}") from None
        grid[name] = grid.get(name, []) + values
    file_grid = {name: values for name, values in spec.grid.items() if name not in base}
    return SweepSpec.create(
        {**spec.base, **base}, {**file_grid, **grid},
        sample=args.sample if args.sample is not None else spec.sample,
        sample_seed=args.sample_seed if args.sample_seed is not None else spec.sample_seed,
    )


def executor_from_args(args: argparse.Namespace) -> Executor:
    """The executor the execution flags choose (Ray is imported only for --executor ray)."""
    from kvlab.errors import KvlabError
    from kvlab.sweep import make_executor

    if args.address is not None and args.executor != "ray":
        raise KvlabError("--address is the Ray cluster's: add --executor ray")
    if args.workers is not None and args.workers < 1:
        raise KvlabError(f"--workers {args.workers}: expected a whole number >= 1")
    return make_executor(args.executor, workers=args.workers, address=args.address)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab sweep`."""
    add_spec_arguments(parser, what="run")
    parser.add_argument("-o", "--output", default=None, metavar="DIR",
                        help="the Parquet dataset (a folder) rows are appended to (default: "
                        "the sweep file's name with .parquet, or sweep.parquet)")
    parser.add_argument("--show", default=",".join(SHOWN), metavar="KEY,...",
                        help="summary keys printed for each run after the sweep (default "
                        f"{','.join(SHOWN)}; every key is in the rows)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print how many runs the sweep has and would run, and stop")


def output_folder(args: argparse.Namespace, suffix: str, default: str) -> Path:
    """--output, else the sweep file's name with `suffix`, else `default`."""
    if args.output:
        return Path(args.output)
    if args.file:
        return Path(args.file).with_suffix(suffix)
    return Path(default)


def run(args: argparse.Namespace) -> int:
    """Run the sweep, then print what it did and a table of its runs."""
    from kvlab.sweep import SweepStore, points_to_run, run_sweep

    spec = sweep_spec(args)
    points = spec.points()
    store = SweepStore(output_folder(args, ".parquet", default="sweep.parquet"))
    if args.dry_run:
        todo, _ = points_to_run(points, store.statuses(), force=args.force,
                                retry_failed=args.retry_failed)
        print(f"{len(points)} runs ({spec.grid_size} in the grid); {len(todo)} to simulate, "
              f"{len(points) - len(todo)} stored in {store.path}")
        return 0
    _warn_points(points)
    executor = executor_from_args(args)
    try:
        report = run_sweep(points, store, executor, force=args.force,
                           retry_failed=args.retry_failed, progress=show_progress(args))
    finally:
        executor.close()
    _print_runs(store, points, list(spec.grid), [k.strip() for k in args.show.split(",")
                                                 if k.strip()])
    stored = f"; {report.num_skipped} already in {store.path}" if report.num_skipped else ""
    failed = f", {report.num_errors} failed (rows with status error)" if report.num_errors \
        else ""
    print(f"{report.num_run} runs simulated in {report.wall_s:.1f} s{failed}{stored}")
    print(f"rows: pandas.read_parquet({str(store.path)!r})")
    return 0


def _warn_points(points: list[dict[str, Any]]) -> None:
    """On stderr, each distinct warning of the sweep's machines (`config_warnings`, as `sim`
    prints them) once, with how many runs it concerns; a point whose config fails is left to
    its run, which records the error."""
    from kvlab.cli.commands.common import config_warnings
    from kvlab.errors import KvlabError
    from kvlab.sweep.runner import sim_config

    counts: dict[str, int] = {}
    for point in points:
        try:
            warnings = config_warnings(sim_config(point))
        except KvlabError:
            continue
        for warning in warnings:
            counts[warning] = counts.get(warning, 0) + 1
    for warning, count in counts.items():
        print(f"warning: {warning} ({count} of {len(points)} runs)", file=sys.stderr)


def _print_runs(store: Any, points: list[dict[str, Any]], swept: list[str],
                keys: list[str]) -> None:
    """This sweep's stored rows in grid order: the swept settings and headline metrics, or
    the error."""
    from kvlab.cli.report import format_table
    from kvlab.sweep import PARAM_PREFIX, run_key

    frame = store.read()
    if frame.empty:
        return
    rows = {row["run_key"]: row
            for row in frame.astype(object).where(frame.notna(), None).to_dict("records")}
    # a swept setting is printed once, as the setting (a summary key can share its name)
    shown = [name for name in keys if name in frame.columns and name not in swept]
    table = []
    for key in (run_key(point) for point in points):
        if key in rows:
            row = rows[key]
            line = {name: row.get(PARAM_PREFIX + name) for name in swept}
            line.update({name: row.get(name) for name in shown})
            line["error"] = (row.get("error") or "")[:80]
            table.append(line)
    errors = ["error"] if any(line["error"] for line in table) else []
    print(format_table(table, [*swept, *shown, *errors]))
