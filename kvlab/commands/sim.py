"""`kvlab sim`: simulate a trace through one memory policy (or compare several) and print
vLLM's benchmark report with a KV-cache section.

Flags take vLLM's names where the meaning is the same (bench: dataset, arrivals, metrics, result
files; engine: block size, batch limits, memory sizing, prefix caching).
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from kvlab.commands.common import (
    add_report_arguments,
    add_workload_arguments,
    load_trace_from_args,
    policy_with_block_size,
    show_progress,
    summary_options,
)

if TYPE_CHECKING:
    from kvlab.metrics import RunResult
    from kvlab.sim import SimConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab sim` (no heavy imports here)."""
    add_workload_arguments(
        parser.add_argument_group("workload"),
        num_prompts=None,
        num_prompts_help="keep the first N requests (random: generate N, default 1000)",
        seed_help="seed of resampled arrivals and synthetic lengths",
    )

    machine = parser.add_argument_group("model, hardware and memory")
    machine.add_argument(
        "--model", default="llama-2-7b", help="model preset or spec file (see `kvlab presets`)"
    )
    machine.add_argument(
        "--hardware", default="a100-80g", help="hardware preset or spec file (see `kvlab presets`)"
    )
    machine.add_argument("--tensor-parallel-size", type=int, default=1)
    machine.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of HBM for weights, activations and KV cache",
    )
    machine.add_argument(
        "--num-gpu-blocks-override",
        type=int,
        default=None,
        help="KV pages per device, whatever the memory says",
    )
    machine.add_argument(
        "--cost-model",
        default=None,
        metavar="FILE",
        help="calibrated cost model from `kvlab calibrate` (default: the roofline of "
        "--model and --hardware)",
    )
    machine.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest request (prompt + output); default: the model's",
    )

    policy = parser.add_argument_group("policy and scheduler")
    which = policy.add_mutually_exclusive_group()
    which.add_argument(
        "--policy",
        default="paged",
        metavar="SPEC",
        help="memory policy, e.g. paged:block_size=16,eviction=lru,"
        "preemption=swap (see `kvlab policies`)",
    )
    which.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="SPEC",
        help="simulate each policy on the same trace; print them side by side",
    )
    policy.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per page for every policy whose spec leaves block_size at its default (16)",
    )
    policy.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="cache prompt pages (eviction none becomes lru)",
    )
    policy.add_argument("--max-num-seqs", type=int, default=256)
    policy.add_argument("--max-num-batched-tokens", type=int, default=8192)
    policy.add_argument(
        "--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True
    )

    add_report_arguments(
        parser.add_argument_group("report and results"),
        save_help="write the summary JSON and per-request and per-step tables",
    )


def run(args: argparse.Namespace) -> int:
    """Simulate, print the start-up lines and the report; save results when asked."""
    from kvlab.metrics import summarize
    from kvlab.report import format_comparison, format_report
    from kvlab.sim import simulate

    options = summary_options(args)
    configs = [_config(args, spec) for spec in (args.compare or [args.policy])]
    for config in configs:
        config.check()  # bad flags fail before the trace loads
    capacities = [config.kv_capacity() for config in configs]
    trace = load_trace_from_args(args)
    progress = show_progress(args)
    runs: list[tuple[RunResult, dict[str, Any]]] = []
    for index, (config, capacity) in enumerate(zip(configs, capacities, strict=True)):
        prefix = f"[{index + 1}] " if args.compare else ""
        for line in capacity.startup_lines(config.effective_max_model_len()):
            print(prefix + line)
        result = simulate(trace, config, progress=progress)
        summary = summarize(result, **options)
        runs.append((result, summary))
    summaries = [summary for _, summary in runs]
    if args.compare:
        print(format_comparison(summaries, [str(s["policy"]) for s in summaries]))
    else:
        print(format_report(summaries[0]))
    if args.save_result:
        _save(args, runs)
    return 0


def _config(args: argparse.Namespace, spec_text: str) -> SimConfig:
    from kvlab.sim import SimConfig

    return SimConfig(
        model=args.model,
        hardware=args.hardware,
        tensor_parallel_size=args.tensor_parallel_size,
        policy=policy_with_block_size(spec_text, args.block_size),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching,
        cost_model=args.cost_model,
        seed=args.seed,
    )


def _save(args: argparse.Namespace, runs: list[tuple[RunResult, dict[str, Any]]]) -> None:
    """One summary JSON and two tables per policy; compared policies get numbered names."""
    from kvlab.metrics import default_result_filename, save_results

    base = args.result_filename or default_result_filename(runs[0][1])
    stem = base[: -len(".json")] if base.endswith(".json") else base
    for index, (result, summary) in enumerate(runs):
        name = base
        if args.compare:
            label = re.sub(r"[^A-Za-z0-9._-]+", "_", str(summary["policy"])).strip("_")
            name = f"{stem}-{index + 1}-{label}.json"
        paths = save_results(
            summary,
            result,
            result_dir=args.result_dir,
            result_filename=name,
            table_format=args.table_format,
        )
        print("Saved " + ", ".join(str(path) for path in paths))
