"""`kvlab capacity`: how much KV cache a model gets on a device, and how many requests of a
given length fit at once, for each page size asked, with the platform's page-size rules as
warnings. The numbers `kvlab sim` prints at start-up, without a simulation. For models whose
layers keep different caches (sliding window, chunked local, linear-attention state) a table
per page size shows each KV-cache group's pages and bytes for one request
(`kvlab.specs.kv_layout`).

    kvlab capacity --model llama-3.1-8b --hardware atlas-800t-a2 --block-size 16 128 \
        --max-model-len 4096
    kvlab capacity --model gpt-oss-120b --hardware h200 --max-model-len 32768
    kvlab capacity --model llama-3.1-8b --hardware atlas-800t-a2 --kv-cache-dtype int8 \
        --block-size 128
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab capacity`."""
    from kvlab.cli.commands.common import add_kv_cache_dtype_argument
    from kvlab.policies.serving import ServingConfig
    from kvlab.specs.presets import DEFAULT_HARDWARE, DEFAULT_MODEL

    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="model preset, spec file or Hugging Face model folder (default "
                        f"{DEFAULT_MODEL})")
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE,
                        help=f"hardware preset or spec file (default {DEFAULT_HARDWARE})")
    parser.add_argument("--block-size", type=int, nargs="+", default=[16], metavar="N",
                        help="page sizes in tokens, one answer each (default 16)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="tokens per request that the concurrency counts (default: the "
                        "model's limit)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="devices the model is split over (default 1)")
    utilization = ServingConfig().gpu_memory_utilization
    parser.add_argument("--gpu-memory-utilization", type=float, default=utilization,
                        help="share of device memory for weights, activations and KV cache "
                        f"(default {utilization})")
    parser.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", default=None,
                        dest="kv_cache_memory_bytes", metavar="SIZE",
                        help="KV cache size per device, e.g. 256MiB or 2GiB, as vLLM's "
                        "--kv-cache-memory-bytes (default: from --gpu-memory-utilization)")
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None, metavar="N",
                        help="KV pages per device, whatever the memory says (wins over "
                        "--kv-cache-memory)")
    add_kv_cache_dtype_argument(parser)
    parser.add_argument("--enable-prefix-caching", action="store_true",
                        help="the server will cache prefixes (Ascend: forces block 128)")
    parser.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill",
                        action="store_false",
                        help="the server will not chunk prefills (Ascend: chunked prefill "
                        "forces block 128)")
    from kvlab.policies.scheduler_config import DEFAULT_MAX_NUM_BATCHED_TOKENS

    parser.add_argument("--max-num-batched-tokens", type=int,
                        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                        help="tokens one step schedules: with the batches in flight they bound "
                        "what sliding-window and chunked groups hold beyond their window "
                        f"(default {DEFAULT_MAX_NUM_BATCHED_TOKENS})")
    parser.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false",
                        help="one batch in flight instead of vLLM's default two (vLLM's CPU "
                        "platform always runs one)")
    parser.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                        help="sliding-window and chunked layers keep every token, as vLLM's "
                        "flag of that name (and platforms without hybrid support) make them")
    parser.add_argument("--json", action="store_true", help="print the answers as JSON")


def capacity_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One answer per block size: pages, tokens, bytes per page, concurrency, the KV-cache
    groups' share of one request, warnings."""
    from kvlab.errors import KvlabError
    from kvlab.policies.serving import parse_memory_size
    from kvlab.specs import get_hardware, get_model
    from kvlab.specs.block_rules import block_size_warnings, platform_of
    from kvlab.specs.capacity import kv_cache_capacity_tokens
    from kvlab.specs.kv_dtype import kv_cache_dtype, platform_warnings
    from kvlab.specs.kv_layout import max_in_flight_tokens

    hardware = get_hardware(args.hardware)
    model = get_model(args.model).with_kv_cache_dtype(args.kv_cache_dtype)
    dtype = kv_cache_dtype(model.kv_cache_dtype)
    length = args.max_model_len or model.max_model_len
    if not 1 <= length <= model.max_model_len:  # (as sim and vLLM refuse it)
        raise KvlabError(f"--max-model-len {length}: expected 1 to {model.max_model_len:,}, the "
                         f"context length of model {model.name!r}")
    if args.max_num_batched_tokens < 1:
        raise KvlabError(f"--max-num-batched-tokens {args.max_num_batched_tokens}: expected 1 "
                         "or more")
    in_flight = max_in_flight_tokens(args.max_num_batched_tokens, platform_of(hardware),
                                     async_scheduling=args.async_scheduling)
    sizing = {"max_in_flight_tokens": in_flight,
              "enable_prefix_caching": args.enable_prefix_caching}
    kv_cache_memory_bytes = None if args.kv_cache_memory_bytes is None \
        else parse_memory_size(args.kv_cache_memory_bytes)
    rows = []
    for block_size in args.block_size:
        if block_size < 1:
            raise KvlabError(f"--block-size {block_size}: expected 1 or more")
        capacity = kv_cache_capacity_tokens(
            model, hardware, page_size=block_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            tensor_parallel_size=args.tensor_parallel_size,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager)
        warnings = block_size_warnings(
            hardware, block_size, enable_prefix_caching=args.enable_prefix_caching,
            enable_chunked_prefill=args.enable_chunked_prefill,
            kv_cache_dtype=dtype.name)
        warnings += platform_warnings(dtype, platform_of(hardware))
        if capacity.page_size != block_size:
            warnings.append(f"block_size {block_size}: vLLM raises the attention pages to "
                            f"{capacity.page_size} tokens so that one holds a linear-attention "
                            "state")
        rows.append({
            "block_size": block_size,
            "kv_cache_dtype": dtype.name,
            "page_size_tokens": capacity.page_size,
            "num_gpu_blocks": capacity.num_pages,
            "kv_cache_size_tokens": capacity.num_tokens,
            "page_bytes": capacity.page_bytes,
            "max_model_len": length,
            "max_concurrency": capacity.max_concurrency(length, **sizing),
            "groups": [{
                "group": usage.group.label,
                "kind": usage.group.kind,
                "window": usage.group.window,
                "num_layers": usage.group.num_layers,
                "num_padding_layers": usage.group.num_padding_layers,
                "pages_per_request": usage.num_pages,
                "bytes_per_request": usage.page_bytes,
                "used_bytes_per_request": usage.used_bytes,
            } for usage in capacity.group_usage(length, **sizing)],
            "warnings": warnings,
        })
    return rows


def run(args: argparse.Namespace) -> int:
    """Print a table (or JSON) of the answers; warnings on stderr under the table."""
    import json
    import sys

    rows = capacity_rows(args)
    if args.json:
        print(json.dumps({"model": args.model, "hardware": args.hardware,
                          "tensor_parallel_size": args.tensor_parallel_size,
                          "answers": rows}, indent=2))
        return 0
    length = rows[0]["max_model_len"]
    print(f"{args.model} on {args.hardware} (tensor parallel {args.tensor_parallel_size}, "
          f"{_sizing(args)}, KV cache {rows[0]['kv_cache_dtype']}), per device:")
    print(f"{'block size':>10} {'KV pages':>12} {'KV tokens':>14} {'KiB/page':>9} "
          f"{f'requests of {length:,} tokens at once':>34}")
    for row in rows:
        print(f"{row['block_size']:>10} {row['num_gpu_blocks']:>12,} "
              f"{row['kv_cache_size_tokens']:>14,} {row['page_bytes'] / 1024:>9,.0f} "
              f"{row['max_concurrency']:>33.2f}x")
    for row in rows:
        if len(row["groups"]) > 1:
            print()
            print(group_table(row))
    for row in rows:
        for warning in row["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
    return 0


def group_table(row: dict[str, Any]) -> str:
    """Where one request's pages and bytes go, group by group, for one answer of
    `capacity_rows` (the pages vLLM sets aside per request, its concurrency's divisor)."""
    from kvlab.cli.commands.presets import format_table

    groups = row["groups"]
    total_pages = sum(g["pages_per_request"] for g in groups)
    total_bytes = sum(g["bytes_per_request"] for g in groups)
    lines = [[
        g["group"],
        f"{g['num_layers']}" + (f"+{g['num_padding_layers']}" if g["num_padding_layers"] else ""),
        f"{g['pages_per_request']:,}",
        f"{g['bytes_per_request'] / 2**20:,.1f}",
        f"{g['used_bytes_per_request'] / 2**20:,.1f}",
        f"{100 * g['bytes_per_request'] / total_bytes:.1f}",
    ] for g in groups]
    used = sum(g["used_bytes_per_request"] for g in groups)
    lines.append(["total", "", f"{total_pages:,}", f"{total_bytes / 2**20:,.1f}",
                  f"{used / 2**20:,.1f}", "100.0"])
    heading = (f"block size {row['block_size']}: one request of {row['max_model_len']:,} "
               f"tokens, by KV-cache group (pages of {row['page_size_tokens']} tokens, "
               f"{row['page_bytes'] / 1024:,.0f} KiB; {row['num_gpu_blocks']:,} pages / "
               f"{total_pages:,} = {row['max_concurrency']:.2f} requests)")
    header = ("group", "layers(+pad)", "pages", "MiB", "MiB used", "% of bytes")
    return heading + "\n" + format_table(header, lines)


def _sizing(args: argparse.Namespace) -> str:
    """The flag that sized the KV cache, as the table's heading names it."""
    if args.num_gpu_blocks_override is not None:
        return f"num_gpu_blocks_override {args.num_gpu_blocks_override}"
    if args.kv_cache_memory_bytes is not None:
        return f"KV cache {args.kv_cache_memory_bytes}"
    return f"gpu_memory_utilization {args.gpu_memory_utilization}"
