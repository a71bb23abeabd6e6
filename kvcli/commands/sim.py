"""`kvlab sim`: simulate a trace through one memory policy (or compare several) and print
vLLM's benchmark report with a KV-cache section.

Flags take vLLM's names where the meaning is the same (bench: dataset, arrivals, metrics, result
files; engine: block size, batch limits, memory sizing, prefix caching).
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from kvlab.cli.commands.common import (
    add_cluster_arguments,
    add_machine_arguments,
    add_report_arguments,
    add_serving_arguments,
    add_workload_arguments,
    load_trace_from_args,
    serving_config,
    show_progress,
    summary_options,
)

if TYPE_CHECKING:
    from kvlab.metrics import RunResult
    from kvlab.sim import ClusterResult, SimConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab sim` (no heavy imports here)."""
    add_workload_arguments(
        parser.add_argument_group("workload"),
        num_prompts=None,
        num_prompts_help="keep the first N requests (random: generate N, default 1000)",
        seed_help="seed of resampled arrivals and synthetic lengths",
    )

    machine = parser.add_argument_group("model, hardware and memory")
    add_machine_arguments(machine)
    add_serving_arguments(
        parser.add_argument_group("policy and scheduler"), machine, compare=True
    )

    add_report_arguments(
        parser.add_argument_group("report and results"),
        save_help="write the summary JSON and per-request and per-step tables",
    )
    add_cluster_arguments(parser.add_argument_group("cluster"))
    parser.add_argument("--plot", metavar="DIR", help="write the run's figures (compared "
                        "runs side by side) to DIR as HTML, PNG and SVG, as kvlab plot does")


def run(args: argparse.Namespace) -> int:
    """Simulate, print the start-up lines and the report; save results when asked."""
    from kvlab.cli.report import format_comparison, format_report
    from kvlab.metrics import summarize
    from kvlab.sim import simulate

    options = summary_options(args)
    _check_cluster(args)
    if args.num_instances > 1:
        return _run_cluster(args, options)
    configs = _configs(args)  # bad flags fail before the trace loads
    _warn_config(configs[0])
    trace = load_trace_from_args(args)
    progress = show_progress(args)
    runs: list[tuple[RunResult, dict[str, Any]]] = []
    interrupted = False
    for index, config in enumerate(configs):
        prefix = f"[{index + 1}] " if args.compare else ""
        for line in config.startup_lines():
            print(prefix + line)
        result = simulate(trace, config, progress=progress, partial_on_interrupt=True)
        summary = summarize(result, **options)
        runs.append((result, summary))
        interrupted = _interrupted(result, len(trace))
        if interrupted:
            break
    summaries = [summary for _, summary in runs]
    if args.compare:
        print(format_comparison(summaries, [str(s["policy"]) for s in summaries]))
    else:
        print(format_report(summaries[0]))
    if args.save_result:
        _save(args, runs)
    if args.plot:
        from kvlab.cli.commands.plot import plot_runs
        plot_runs(args.plot, runs)
    return 130 if interrupted else 0


def _interrupted(result: RunResult, num_requests: int) -> bool:
    """Whether Ctrl-C cut this run short (`simulate(partial_on_interrupt=True)`); says so on
    stderr, with how much of the trace the report then covers."""
    import sys

    at_s = result.metadata.get("interrupted_at_s")
    if at_s is None:
        return False
    finished = num_requests - int(result.metadata["num_unfinished_requests"])
    print(f"kvlab sim: interrupted at {at_s:.1f} s of simulated time: the report covers "
          f"the {finished} of {num_requests} requests finished by then", file=sys.stderr)
    return True


def _check_cluster(args: argparse.Namespace) -> None:
    """--num-instances, --router and --router-seed, before any work (the router is checked
    with one instance too: a typo should not wait for a cluster run to show)."""
    from kvlab.errors import KvlabError
    from kvlab.policies.scheduler_config import check_whole_number
    from kvlab.sim.router import check_router

    check_whole_number("num_instances", args.num_instances, 1)
    check_router(args.router)
    check_whole_number("router_seed", args.router_seed, 0)
    if args.pd is not None:
        from kvlab.sim.disaggregation import parse_pd, pd_num_instances

        args.num_instances = pd_num_instances(parse_pd(args.pd), args.num_instances)
    if args.pd_link_bandwidth is not None and not args.pd_link_bandwidth > 0:
        raise KvlabError(f"pd_link_bandwidth {args.pd_link_bandwidth}: expected GB/s > 0",
                         parameters=("pd_link_bandwidth",))


def _run_cluster(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """`--num-instances N` > 1: each policy on N instances behind --router; the report of the
    whole cluster, then a table of its instances."""
    from kvlab.cli.report import format_comparison, format_instances, format_report
    from kvlab.sim import simulate_cluster, summarize_cluster
    from kvlab.sim.disaggregation import parse_pd

    configs = _configs(args)  # before the trace loads
    pd = None if args.pd is None else parse_pd(args.pd)
    bandwidth = None if args.pd_link_bandwidth is None else args.pd_link_bandwidth * 1e9
    _warn_config(configs[0])
    trace = load_trace_from_args(args)
    progress = show_progress(args)
    runs: list[tuple[ClusterResult, dict[str, Any]]] = []
    for index, config in enumerate(configs):
        prefix = f"[{index + 1}] " if args.compare else ""
        for line in config.startup_lines():
            print(f"{prefix}{line} (each of {args.num_instances} instances)")
        result = simulate_cluster(trace, config, num_instances=args.num_instances,
                                  router=args.router, router_seed=args.router_seed, pd=pd,
                                  pd_link_bandwidth=bandwidth, progress=progress)
        runs.append((result, summarize_cluster(result, **options)))
    summaries = [summary for _, summary in runs]
    if args.compare:
        print(format_comparison(summaries, [str(s["policy"]) for s in summaries]))
        for index, summary in enumerate(summaries, start=1):
            print(format_instances(summary["instances"], title=f"[{index}] Per Instance"))
    else:
        print(format_report(summaries[0]))
        print(format_instances(summaries[0]["instances"]))
    if args.save_result:
        _save_clusters(args, runs)
    if args.plot:
        from kvlab.cli.commands.plot import plot_runs
        plot_runs(args.plot, runs)
    return 0


def _warn_config(config: SimConfig) -> None:
    """On stderr, each of `config_warnings`."""
    from kvlab.cli.commands.common import config_warnings, print_warnings

    print_warnings(config_warnings(config))


def _configs(args: argparse.Namespace) -> list[SimConfig]:
    """One SimConfig per policy (--policy, or each of --compare): presets and cost model read
    once, for the first; the others only change the policy."""
    from kvlab.sim import SimConfig

    specs = args.compare or [args.policy]
    first = SimConfig(
        model=args.model,
        hardware=args.hardware,
        serving=serving_config(args, specs[0]),
        tensor_parallel_size=args.tensor_parallel_size,
        cost_model=args.cost_model,
    )
    return [first] + [first.with_policy(serving_config(args, spec).policy) for spec in specs[1:]]


def _save(args: argparse.Namespace, runs: list[tuple[RunResult, dict[str, Any]]]) -> None:
    """One summary JSON and two tables per policy; compared policies get numbered names."""
    from kvlab.metrics import save_results

    for name, (result, summary) in zip(_result_names(args, [s for _, s in runs]), runs,
                                       strict=True):
        paths = save_results(
            summary,
            result,
            result_dir=args.result_dir,
            result_filename=name,
            table_format=args.table_format,
        )
        print("Saved " + ", ".join(str(path) for path in paths))


def _save_clusters(args: argparse.Namespace,
                   runs: list[tuple[ClusterResult, dict[str, Any]]]) -> None:
    """As `_save`, for clusters: the summary with its per-instance summaries, and tables of
    every request and every instance's steps, each row with its instance."""
    from kvlab.metrics import save_results
    from kvlab.sim.cluster_result import cluster_request_table, cluster_step_table

    for name, (result, summary) in zip(_result_names(args, [s for _, s in runs]), runs,
                                       strict=True):
        tables = {"requests": cluster_request_table(result), "steps": cluster_step_table(result)}
        paths = save_results(summary, result.cluster, result_dir=args.result_dir,
                             result_filename=name, table_format=args.table_format,
                             tables=tables)
        print("Saved " + ", ".join(str(path) for path in paths))


def _result_names(args: argparse.Namespace, summaries: list[dict[str, Any]]) -> list[str]:
    """The summary file name of each run: --result-filename (or vLLM's default); compared
    policies get numbered names."""
    from kvlab.metrics import default_result_filename

    base = args.result_filename or default_result_filename(summaries[0])
    if not args.compare:
        return [base]
    stem = base[: -len(".json")] if base.endswith(".json") else base
    names = []
    for index, summary in enumerate(summaries):
        label = re.sub(r"[^A-Za-z0-9._-]+", "_", str(summary["policy"])).strip("_")
        names.append(f"{stem}-{index + 1}-{label}.json")
    return names
