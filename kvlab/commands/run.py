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

from kvlab.commands.common import (
    add_report_arguments,
    add_workload_arguments,
    load_trace_from_args,
    policy_with_block_size,
    show_progress,
    summary_options,
)

if TYPE_CHECKING:  # the engine imports torch: only when a command runs it
    from kvlab.engine.config import EngineConfig

DEFAULT_NUM_PROMPTS = 32
DEFAULT_CPU_KV_CACHE_MEMORY = "512MiB"  # vLLM's 4 GiB cpu default takes seconds to allocate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab run` (no heavy imports here)."""
    data = parser.add_argument_group("workload")
    add_workload_arguments(
        data,
        num_prompts=DEFAULT_NUM_PROMPTS,
        num_prompts_help=f"keep the first N requests (default {DEFAULT_NUM_PROMPTS})",
        seed_help="seed of resampled arrivals, synthetic lengths and prompt token ids",
    )
    _replay_arguments(data)
    _engine_arguments(parser.add_argument_group("model, device and memory"))
    _policy_arguments(parser.add_argument_group("policy and scheduler"))
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
        help="tiny-llama, tiny-qwen2, or a local Hugging Face folder "
        "(config.json and *.safetensors)",
    )
    machine.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or npu")
    machine.add_argument(
        "--attention-backend",
        default="torch",
        help="kernel backend: torch (reference), triton, npu",
    )
    machine.add_argument(
        "--dtype", default=None, help="float32, float16 or bfloat16 (default: the checkpoint's)"
    )
    machine.add_argument(
        "--kv-cache-memory",
        default=None,
        metavar="SIZE",
        help="KV cache size, e.g. 256MiB or 2GiB (default on cpu: "
        f"{DEFAULT_CPU_KV_CACHE_MEMORY}; on gpu/npu: from "
        "--gpu-memory-utilization)",
    )
    machine.add_argument(
        "--swap-space",
        default="4GiB",
        metavar="SIZE",
        help="host memory bounding the swap pages (default 4GiB)",
    )
    machine.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of device memory for weights, activations and KV cache",
    )
    machine.add_argument(
        "--num-gpu-blocks-override",
        type=int,
        default=None,
        help="KV pages, whatever the memory says",
    )
    machine.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest request (prompt + output); default: the model's; longer requests fail",
    )


def _policy_arguments(policy: argparse._ArgumentGroup) -> None:
    policy.add_argument(
        "--policy",
        default="paged",
        metavar="SPEC",
        help="memory policy, e.g. paged:block_size=16,eviction=lru,"
        "preemption=swap (see `kvlab policies`)",
    )
    policy.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per page when the spec leaves block_size at its default",
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


def run(args: argparse.Namespace) -> int:
    """Build the engine, replay the trace, print the report; save results when asked."""
    from kvlab.engine.engine import LLMEngine
    from kvlab.engine.replay import run_trace, synthesize_prompt_ids
    from kvlab.metrics import summarize
    from kvlab.report import format_report

    options = summary_options(args)
    config = engine_config(args)
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
    """The EngineConfig the flags describe (sizes parsed, page size applied as `kvlab sim`)."""
    from kvlab.engine.config import EngineConfig, parse_memory_size

    kv_memory = args.kv_cache_memory
    if kv_memory is None and args.device == "cpu" and args.num_gpu_blocks_override is None:
        kv_memory = DEFAULT_CPU_KV_CACHE_MEMORY
    return EngineConfig(
        model=args.model,
        device=args.device,
        policy=policy_with_block_size(args.policy, args.block_size),
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        kv_cache_memory_bytes=None if kv_memory is None else parse_memory_size(kv_memory),
        swap_space_bytes=parse_memory_size(args.swap_space, "--swap-space"),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching,
        attention_backend=args.attention_backend,
        dtype=args.dtype,
        seed=args.seed,
        step_timer=args.step_timer,
        warmup=args.warmup,
    )


def _print_failures(requests: Sequence[Any]) -> None:
    failed = [r for r in requests if r.error is not None]
    if failed:
        print(f"{len(failed)} request(s) failed; first: {failed[0].error}", file=sys.stderr)
