"""`kvlab plot`: the figures of saved results, as self-contained HTML and PNG/SVG images."""

from __future__ import annotations

import argparse
from typing import Any


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kvlab plot RESULT... -o DIR` and its options."""
    parser.add_argument(
        "results", nargs="+", metavar="RESULT",
        help="a run's summary JSON (--save-result; its .requests/.steps tables beside it), "
        "a sweep's Parquet folder (kvlab sweep -o) or a validation report (kvlab validate "
        "--save-result); several runs are compared")
    parser.add_argument("-o", "--output", metavar="DIR", default="figures",
                        help="folder the figures are written to (default figures)")
    parser.add_argument("--format", default="html,png,svg", type=_names, metavar="FMT,...",
                        help="any of html (plotly.js inlined: works offline), png, svg "
                        "(matplotlib, no browser) (default html,png,svg)")
    parser.add_argument("--metric", default=None, type=_names, metavar="KEY,...",
                        help="a sweep's metrics to draw (default output_throughput, "
                        "mean_ttft_ms, p99_ttft_ms, mean_tpot_ms, num_preemptions, "
                        "peak_kv_usage_perc)")
    parser.add_argument("--keys", default=None, type=_names, metavar="KEY[,KEY2]",
                        help="a sweep's settings on the x axis (and, second, the heat map's "
                        "y axis and the lines; default: the settings it varied)")


def run(args: argparse.Namespace) -> int:
    """Load the results, write their figures, list the files."""
    from kvlab.plots import load_results, plot_results

    results = load_results(args.results)
    paths = plot_results(results, args.output, formats=tuple(args.format),
                         metrics=args.metric, keys=args.keys)
    for path in paths:
        print(f"Saved {path}")
    return 0


def plot_runs(out_dir: str, runs: list[tuple[Any, dict[str, Any]]]) -> None:
    """`kvlab sim --plot DIR`: the figures of the runs just simulated (one run's, or several
    compared), as `kvlab plot` draws them from saved results; a cluster's per instance."""
    from kvlab.metrics import per_request_table, per_step_table
    from kvlab.plots import RunData, plot_results
    from kvlab.sim.cluster_result import ClusterResult, cluster_request_table, cluster_step_table

    data = []
    for result, summary in runs:
        if isinstance(result, ClusterResult):
            requests, steps = cluster_request_table(result), cluster_step_table(result)
        else:
            requests, steps = per_request_table(result), per_step_table(result)
        data.append(RunData(label=str(summary.get("policy") or "sim"), summary=summary,
                            requests=requests, steps=steps, stem="sim"))
    for path in plot_results(list(data), out_dir):
        print(f"Saved {path}")
