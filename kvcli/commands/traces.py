"""`kvlab traces`: inspect request traces (`kvlab traces info PATH`, `kvlab traces list`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `info` and `list` actions and their flags (no heavy imports here)."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="summarise a trace: size, rate, lengths, sharing")
    info.add_argument(
        "path",
        metavar="PATH",
        help="a trace file, or a bundled excerpt name (see `kvlab traces list`)",
    )
    info.add_argument(
        "--dataset-name",
        default=None,
        help="azure, mooncake, burstgpt or sharegpt; guessed when omitted "
        "(.jsonl: mooncake, .json: sharegpt, CSV: by its header)",
    )
    info.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="keep only the first N requests in arrival order",
    )
    info.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="divide trace timestamps by this (2 replays twice as fast; default 1)",
    )
    info.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="resample arrivals at this many requests/s; inf: all at 0 (default: replay the "
        "trace's timestamps)",
    )
    info.add_argument(
        "--burstiness", type=float, default=1.0,
        help="gamma shape of resampled gaps (default 1: Poisson)",
    )
    info.add_argument("--seed", type=int, default=0, help="seed of resampled arrivals")
    info.add_argument(
        "--tokenizer",
        default=None,
        help="sharegpt: local Hugging Face tokenizer folder for exact lengths",
    )
    actions.add_parser("list", help="list the bundled trace excerpts")


def run(args: argparse.Namespace) -> int:
    """Print the chosen action's table."""
    if args.action == "list":
        return _list()
    from kvlab.traces import format_info, guess_dataset_name, load_trace, resolve_trace_path

    path = resolve_trace_path(args.path)
    dataset_name = args.dataset_name or guess_dataset_name(path)
    options = {"tokenizer": args.tokenizer} if args.tokenizer is not None else {}
    trace = load_trace(
        dataset_name,
        path,
        num_prompts=args.num_prompts,
        seed=args.seed,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        time_scale=args.time_scale,
        **options,
    )
    print(format_info(trace.info()))
    return 0


def _list() -> int:
    from kvlab.traces import bundled_traces

    for name, path in bundled_traces().items():
        print(f"{name:<12}{path.stat().st_size / 1e3:>8,.0f} kB  {path}")
    print("Sources and licences: traces/data/ATTRIBUTION.md")
    return 0
