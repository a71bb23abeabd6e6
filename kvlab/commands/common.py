"""Flags and helpers shared by the commands that replay a trace (`sim`, `run`, `validate`)."""

from __future__ import annotations

import argparse
import math
from typing import Any

DATASET_NAMES = ("azure", "mooncake", "burstgpt", "sharegpt", "random")
_SYNTHETIC_OPTIONS = (
    "tokenizer",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "random_prefix_len",
    "num_prefix_groups",
)


def add_workload_arguments(
    data: argparse._ArgumentGroup, *, num_prompts: int | None, num_prompts_help: str, seed_help: str
) -> None:
    """vLLM's benchmark workload flags, plus --time-scale and the `random` dataset options."""
    data.add_argument(
        "--dataset-name",
        default="azure",
        choices=DATASET_NAMES,
        help="trace format, or random for vLLM's synthetic set (default: azure, "
        "the bundled Azure conversation excerpt)",
    )
    data.add_argument(
        "--dataset-path",
        default=None,
        help="trace file or bundled excerpt name (azure-conv, azure-code, "
        "mooncake); default: the dataset's bundled excerpt",
    )
    data.add_argument("--num-prompts", type=int, default=num_prompts, help=num_prompts_help)
    data.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="resample arrivals at this many requests/s (default inf: replay the "
        "trace's timestamps; random sends everything at 0)",
    )
    data.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of resampled arrival gaps (1: Poisson)",
    )
    data.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="divide trace timestamps by this to compress time (4: 4x the rate)",
    )
    data.add_argument("--seed", type=int, default=0, help=seed_help)
    data.add_argument(
        "--tokenizer",
        default=None,
        help="sharegpt: local Hugging Face tokenizer folder for exact lengths",
    )
    for flag, kind, text in (
        ("--random-input-len", int, "random: prompt tokens (default 1024)"),
        ("--random-output-len", int, "random: output tokens (default 128)"),
        ("--random-range-ratio", float, "random: lengths vary uniformly by this share"),
        ("--random-prefix-len", int, "random: shared prefix tokens before each prompt"),
        ("--num-prefix-groups", int, "random: requests share their prefix in this many groups"),
    ):
        data.add_argument(flag, type=kind, default=None, help=text)


def add_report_arguments(out: argparse._ArgumentGroup, *, save_help: str) -> None:
    """vLLM's report and result-file flags."""
    out.add_argument(
        "--percentile-metrics",
        default="ttft,tpot,itl",
        help="metrics with percentiles: any of ttft,tpot,itl,e2el",
    )
    out.add_argument("--metric-percentiles", default="99", help="e.g. 50,90,99")
    out.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="KEY:MS",
        help="SLOs for request goodput, e.g. ttft:500 tpot:50",
    )
    out.add_argument("--save-result", action="store_true", help=save_help)
    out.add_argument("--result-dir", default=".")
    out.add_argument(
        "--result-filename",
        default=None,
        help="summary file name (default: vLLM's <backend>-<rate>qps-<model>-<date>.json)",
    )
    out.add_argument("--table-format", default="csv", choices=("csv", "parquet"))
    out.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: unless --disable-tqdm, and only on a terminal."""
    import sys

    return not args.disable_tqdm and sys.stderr.isatty()


def summary_options(args: argparse.Namespace) -> dict[str, Any]:
    """`kvlab.metrics.summarize`'s keyword arguments from the report flags, parsed now so a bad
    flag fails before the run."""
    from kvlab.metrics import parse_goodput, parse_metric_percentiles, parse_percentile_metrics

    return {
        "percentile_metrics": parse_percentile_metrics(args.percentile_metrics),
        "metric_percentiles": parse_metric_percentiles(args.metric_percentiles),
        "goodput_slos": parse_goodput(args.goodput) if args.goodput else None,
    }


def load_trace_from_args(args: argparse.Namespace) -> Any:
    """The trace the workload flags describe (kvlab.traces.load_trace)."""
    from kvlab.traces import load_trace

    options = {
        name: getattr(args, name) for name in _SYNTHETIC_OPTIONS if getattr(args, name) is not None
    }
    return load_trace(
        args.dataset_name,
        args.dataset_path,
        num_prompts=args.num_prompts,
        seed=args.seed,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        time_scale=args.time_scale,
        **options,
    )


def policy_with_block_size(spec_text: str, block_size: int | None) -> Any:
    """The policy spec, with --block-size applied unless the spec sets another page size."""
    from kvlab.errors import KvlabError
    from kvlab.policies import PolicySpec, parse_policy

    spec = parse_policy(spec_text)
    if block_size is None:
        return spec
    if spec.block_size not in (PolicySpec().block_size, block_size):
        raise KvlabError(
            f"--block-size {block_size} contradicts policy {spec_text!r}, which "
            f"sets block_size={spec.block_size}; give the page size once"
        )
    return spec.with_options(block_size=block_size)
