"""`kvlab run`: replay a trace through the real paged engine and print vLLM's benchmark report.

The flags are `kvlab sim`'s where the meaning is the same; `--model` is a real model here (a
tiny preset or a local Hugging Face folder) and `--device`, `--attention-backend`,
`--kv-cache-memory` and `--replay` choose how it runs. Defaults make a CPU demo quick: the
first 32 requests of the bundled Azure conversation excerpt on `tiny-llama` (its 2,048-token
context fails the few longer requests), a 512 MiB KV cache on cpu, and `--replay fast`, where a
virtual clock advances by the measured step times and skips idle gaps between arrivals.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvlab.cli.commands.common import (
    DEFAULT_CPU_KV_CACHE_MEMORY,
    add_device_arguments,
    add_report_arguments,
    add_serving_arguments,
    add_workload_arguments,
    load_trace_from_args,
    policy_warnings,
    print_warnings,
    serving_config,
    show_progress,
    summary_options,
)

if TYPE_CHECKING:  # the engine imports torch: only when a command runs it
    from kvlab.engine.config import EngineConfig

DEFAULT_NUM_PROMPTS = 32


def add_arguments(parser: argparse.ArgumentParser, *, preset: bool = True) -> None:
    """Flags of `kvlab run` (no heavy imports here); `preset` False leaves out `--preset`
    (validate's names the server's conventions)."""
    data = parser.add_argument_group("workload")
    add_workload_arguments(
        data,
        num_prompts=DEFAULT_NUM_PROMPTS,
        num_prompts_help=f"keep the first N requests (default {DEFAULT_NUM_PROMPTS})",
        seed_help="seed of resampled arrivals, synthetic lengths and prompt token ids",
    )
    _replay_arguments(data)
    machine = parser.add_argument_group("model, device and memory")
    _engine_arguments(machine)
    add_serving_arguments(parser.add_argument_group("policy and scheduler"), machine, engine=True,
                          preset=preset)
    add_report_arguments(
        parser.add_argument_group("report and results"),
        save_help="write the summary JSON, the per-request table and the per-step profile "
        "(what `kvlab calibrate` fits)",
    )


def _replay_arguments(data: argparse._ArgumentGroup) -> None:
    data.add_argument(
        "--replay",
        default="fast",
        choices=("fast", "realtime"),
        help="fast: as fast as possible on a virtual clock of measured step "
        "times (default); realtime: wait for each arrival on the wall clock",
    )
    data.add_argument(
        "--step-timer",
        default="wall",
        choices=("wall", "cpu"),
        help="how step times are measured: wall (default), or cpu: the engine "
        "thread's CPU time with one torch thread (cpu device only; steady on "
        "a shared machine, where other processes take the cores)",
    )
    data.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip the start-up warm-up (the largest prefill a step can hold and a few "
        "decodes, run once so that the first measured steps pay no one-off costs)",
    )


def _engine_arguments(machine: argparse._ArgumentGroup) -> None:
    machine.add_argument(
        "--model",
        default="tiny-llama",
        help="tiny-llama, tiny-qwen2 (random weights), stdlib-llama (trained on Python's "
        "standard library, with a tokenizer and chat template), or a local Hugging Face folder "
        "(config.json and *.safetensors; default tiny-llama)",
    )
    add_device_arguments(machine)


def run(args: argparse.Namespace) -> int:
    """Build the engine, replay the trace, print the report; save results when asked."""
    from kvlab.cli.report import format_report
    from kvlab.engine.engine import LLMEngine
    from kvlab.engine.replay import run_trace
    from kvlab.metrics import summarize
    from kvlab.traces import synthesize_prompt_ids

    options = summary_options(args)
    config = engine_config(args)
    print_warnings(policy_warnings(config.serving.policy))
    trace = load_trace_from_args(args)
    if args.step_timer == "cpu":
        import torch

        torch.set_num_threads(1)  # the thread's CPU time then counts all of a step's work
    engine = LLMEngine(config)
    for line in engine.startup_lines:
        print(line)
    trace = synthesize_prompt_ids(trace, engine.model_config.vocab_size, args.seed)
    progress = show_progress(args)
    result = run_trace(engine, trace, replay=args.replay, progress=progress)
    summary = summarize(result, **options)
    _print_failures(result.requests)
    print(format_report(summary))
    if args.save_result:
        from kvlab.metrics import save_results

        paths = save_results(
            summary,
            result,
            result_dir=args.result_dir,
            result_filename=args.result_filename,
            table_format=args.table_format,
        )
        print("Saved " + ", ".join(str(path) for path in paths))
    return 0


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe (on cpu the KV cache is DEFAULT_CPU_KV_CACHE_MEMORY
    unless a size or a page count is given)."""
    from kvlab.engine.config import EngineConfig

    if args.kv_cache_memory_bytes is None and args.device == "cpu" and (
        args.num_gpu_blocks_override is None
    ):
        args.kv_cache_memory_bytes = DEFAULT_CPU_KV_CACHE_MEMORY
    return EngineConfig(
        model=args.model,
        device=args.device,
        serving=serving_config(args),
        attention_backend=args.attention_backend,
        dtype=args.dtype,
        cpu_gemm=args.cpu_gemm,
        step_timer=args.step_timer,
        warmup=args.warmup,
    )


def _print_failures(requests: Sequence[Any]) -> None:
    failed = [r for r in requests if r.error is not None]
    if failed:
        print(f"{len(failed)} request(s) failed; first: {failed[0].error}", file=sys.stderr)
