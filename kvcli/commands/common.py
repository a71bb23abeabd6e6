"""Flags and helpers shared by the commands that replay a trace (`sim`, `run`, `validate`):
the workload, the serving config and the report."""

from __future__ import annotations

import argparse
from typing import Any

# The engine commands' KV cache on cpu when neither a size nor a page count is given: vLLM's
# 4 GiB cpu default takes seconds to allocate.
DEFAULT_CPU_KV_CACHE_MEMORY = "512MiB"
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
    from kvlab.traces import DATASET_NAMES  # the loaders' registry: no list of names here

    data.add_argument(
        "--dataset-name",
        default=None,
        choices=DATASET_NAMES,
        help="trace format, or random for vLLM's synthetic set (default: read from "
        "--dataset-path, its extension or CSV header; without one, the bundled Azure "
        "conversation excerpt)",
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
        default=None,
        help="resample arrivals at this many requests/s; inf sends every request at 0, as "
        "vLLM's benchmark does (default: replay the trace's timestamps; random: all at 0)",
    )
    data.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of resampled arrival gaps (default 1: Poisson)",
    )
    data.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="divide trace timestamps by this to compress time (4: 4x the rate; default 1)",
    )
    data.add_argument(
        "--length-scale",
        type=int,
        default=1,
        help="divide every prompt and output length, and a trace's hash block size, by this: "
        "the same sharing on a smaller machine (16: Mooncake's 512-token blocks as 32; "
        "default 1)",
    )
    data.add_argument("--ramp-up-strategy", choices=("linear", "exponential"), default=None,
                      help="raise the request rate over the run, as vLLM's benchmark does, "
                      "from --ramp-up-start-rps to --ramp-up-end-rps (instead of "
                      "--request-rate)")
    data.add_argument("--ramp-up-start-rps", type=float, default=None,
                      help="requests/s of the first request under --ramp-up-strategy")
    data.add_argument("--ramp-up-end-rps", type=float, default=None,
                      help="requests/s of the last request under --ramp-up-strategy")
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


def add_machine_arguments(machine: argparse._ArgumentGroup) -> None:
    """The simulated machine's flags (`kvlab sim`, `sweep`, `tune`): model, hardware,
    tensor parallelism and the cost model."""
    from kvlab.specs.presets import DEFAULT_HARDWARE, DEFAULT_MODEL

    machine.add_argument(
        "--model", default=DEFAULT_MODEL,
        help="model preset, spec file or Hugging Face model folder (see `kvlab presets`; "
        f"default {DEFAULT_MODEL})"
    )
    machine.add_argument(
        "--hardware", default=DEFAULT_HARDWARE,
        help=f"hardware preset or spec file (see `kvlab presets`; default {DEFAULT_HARDWARE})"
    )
    machine.add_argument("--tensor-parallel-size", type=int, default=1,
                         help="devices the model's layers are split over; each holds 1/N of "
                         "the weights and KV heads (default 1)")
    machine.add_argument(
        "--cost-model",
        default=None,
        metavar="FILE",
        help="calibrated cost model from `kvlab calibrate` (default: the roofline of "
        "--model and --hardware)",
    )


def add_report_arguments(out: argparse._ArgumentGroup, *, save_help: str = "",
                         files: bool = True) -> None:
    """vLLM's report and result-file flags (`files` False: the report's flags only)."""
    out.add_argument(
        "--percentile-metrics",
        default="ttft,tpot,itl",
        help="metrics with percentiles: any of ttft,tpot,itl,e2el (default ttft,tpot,itl)",
    )
    out.add_argument("--metric-percentiles", default="99",
                     help="percentiles to report, e.g. 50,90,99 (default 99)")
    out.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="KEY:MS",
        help="SLOs for request goodput, e.g. ttft:500 tpot:50",
    )
    out.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    if not files:
        return
    out.add_argument("--save-result", action="store_true", help=save_help)
    out.add_argument("--result-dir", default=".",
                     help="folder for the saved result and tables (default: here)")
    out.add_argument(
        "--result-filename",
        default=None,
        help="summary file name (default: vLLM's <backend>-<rate>qps-<model>-<date>.json)",
    )
    out.add_argument("--table-format", default="csv", choices=("csv", "parquet"),
                     help="format of the per-request and per-step tables (default csv)")


def add_device_arguments(machine: argparse._ActionsContainer) -> None:
    """The device flags of every command that runs the real engine (run, serve, validate)."""
    machine.add_argument("--device", default="cpu",
                         help="cpu, cuda, cuda:N or npu (default cpu)")
    machine.add_argument("--attention-backend", default="torch",
                         help="kernel backend: torch (reference), triton, npu, ascend "
                         "(default torch)")
    machine.add_argument("--dtype", default=None,
                         help="float32, float16 or bfloat16 (default: the checkpoint's)")


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
        ramp_up=_ramp_up(args),
        length_scale=args.length_scale,
        **options,
    )


def _ramp_up(args: argparse.Namespace) -> Any:
    """The RampUp of --ramp-up-*, None without --ramp-up-strategy."""
    from kvlab.traces.arrivals import ramp_up_from

    return ramp_up_from(args.ramp_up_strategy, args.ramp_up_start_rps, args.ramp_up_end_rps)


def add_serving_arguments(
    policy: argparse._ArgumentGroup,
    memory: argparse._ArgumentGroup,
    *,
    compare: bool = False,
    engine: bool = False,
) -> None:
    """The serving config's flags (vLLM's names), one group for every command that runs an
    instance: `--policy` (or, with `compare`, `--compare SPEC ...` instead), page size, prefix
    caching, batch limits, model length and KV memory sizing; `engine` adds the flag that only
    a real engine uses (`--swap-space`) and the engine's cpu default of `--kv-cache-memory`
    to its help. Defaults are `ServingConfig`'s. The dests are ServingConfig's field names, so
    that the CLI can name the flag of a setting a library error speaks of."""
    from kvlab.policies.serving import ServingConfig

    defaults = ServingConfig()
    spec_help = ("memory policy, e.g. paged:block_size=16,eviction=lru,preemption=swap "
                 "(see `kvlab policies`; default paged)")
    if compare:
        which = policy.add_mutually_exclusive_group()
        which.add_argument("--policy", default="paged", metavar="SPEC", help=spec_help)
        which.add_argument(
            "--compare", nargs="+", default=None, metavar="SPEC",
            help="simulate each policy on the same trace; print them side by side",
        )
    else:
        policy.add_argument("--policy", default="paged", metavar="SPEC", help=spec_help)
    policy.add_argument(
        "--block-size", type=int, default=None,
        help=f"tokens per page for every policy whose spec leaves block_size at its default "
        f"({defaults.page_size})",
    )
    policy.add_argument(
        "--enable-prefix-caching", action="store_true",
        help="cache full KV pages for prefix hits (eviction none becomes lru)",
    )
    policy.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs,
                        help="most requests running in one step (default "
                        f"{defaults.max_num_seqs})")
    policy.add_argument("--max-num-batched-tokens", type=int,
                        default=defaults.max_num_batched_tokens,
                        help="token budget of one step, prefill chunks and decodes together "
                        f"(default {defaults.max_num_batched_tokens})")
    policy.add_argument(
        "--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
        default=defaults.enable_chunked_prefill,
        help="split long prompts over steps within the token budget (default: on)",
    )
    add_scheduling_policy_argument(policy)
    policy.add_argument(
        "--scheduler-reserve-full-isl", action=argparse.BooleanOptionalAction, default=None,
        help="admit a waiting request only when its whole prompt fits in KV memory, not just "
        "its first chunk (vLLM 0.32's default; default here: off, and against a server "
        "(validate --base-url) the preset's: on for vllm)",
    )
    memory.add_argument(
        "--max-model-len", type=int, default=None,
        help="longest request (prompt + output); default: the model's; longer requests fail",
    )
    memory.add_argument(
        "--gpu-memory-utilization", type=float, default=defaults.gpu_memory_utilization,
        help="share of device memory for weights, activations and KV cache (default "
        f"{defaults.gpu_memory_utilization})",
    )
    memory.add_argument(
        "--num-gpu-blocks-override", type=int, default=None,
        help="KV pages per device, whatever the memory says",
    )
    default_size = (f"on cpu: {DEFAULT_CPU_KV_CACHE_MEMORY}; on gpu/npu: from "
                    "--gpu-memory-utilization") if engine else "from --gpu-memory-utilization"
    memory.add_argument(
        "--kv-cache-memory", "--kv-cache-memory-bytes", dest="kv_cache_memory_bytes",
        default=None, metavar="SIZE",
        help=f"KV cache size per device, e.g. 256MiB or 2GiB, as vLLM's "
        f"--kv-cache-memory-bytes (--num-gpu-blocks-override wins; default {default_size})",
    )
    add_kv_cache_dtype_argument(memory)
    add_tier_arguments(memory)
    add_kv_group_arguments(memory)
    if engine:
        memory.add_argument(
            "--swap-space", dest="swap_space_bytes", default="4", metavar="GiB",
            help="host memory bounding the swap pages, in GiB as vLLM's --swap-space "
            "(4 = 4 GiB), or a size such as 512MiB (default 4)",
        )


def add_scheduling_policy_argument(policy: argparse._ActionsContainer) -> None:
    """`--scheduling-policy` (vLLM's flag; the orders of `kvlab.policies.scheduling`, listed
    from the registry; the dest is ServingConfig's field)."""
    from kvlab.policies import registry

    described = "; ".join(f"{e.name}: {e.help}" for e in registry.entries()
                          if e.family == "scheduling")
    policy.add_argument(
        "--scheduling-policy", default=None, metavar="SPEC",
        help=f"the order waiting requests are admitted in, NAME[:key=value,...] ({described}; "
        "default fcfs, and against a server (validate --base-url) the one kvlab serve exports)")


def add_kv_cache_dtype_argument(memory: argparse._ActionsContainer) -> None:
    """`--kv-cache-dtype` with vLLM's names (`kvlab.specs.kv_dtype`; the dest is
    ServingConfig's field)."""
    from kvlab.specs.kv_dtype import KV_CACHE_DTYPES, kv_cache_dtype_names

    described = "; ".join(f"{d.name}: {d.help}" for d in KV_CACHE_DTYPES.values())
    memory.add_argument(
        "--kv-cache-dtype", default="auto", choices=kv_cache_dtype_names(), metavar="DTYPE",
        help=f"the KV cache's precision, vLLM's names ({described}; fp8 = fp8_e4m3); pages "
        "are sized in its bytes, scales included (default auto)")


def add_kv_group_arguments(memory: argparse._ArgumentGroup) -> None:
    """The flags of a hybrid model's KV-cache groups (ServingConfig's fields, vLLM's names):
    the sliding-window retention interval and the switch to one full group."""
    memory.add_argument(
        "--prefix-cache-retention-interval", type=_retention_interval, default=None,
        metavar="TOKENS",
        help="sliding-window and state groups with prefix caching: cache only the pages a "
        "prefix hit can use, a hit at a prompt's end and (TOKENS > 0) at each multiple of "
        "TOKENS, freeing the rest at once (vLLM's flag; a multiple of --block-size; 0 is "
        "vLLM 0.32's default; default here: None, every page cached)")
    memory.add_argument(
        "--disable-hybrid-kv-cache-manager", dest="hybrid_kv_cache_manager",
        action="store_false",
        help="sliding and chunked attention layers keep every token, as full attention "
        "(vLLM's flag: one KV-cache group, the plain manager)")


def _retention_interval(text: str) -> int | None:
    """`None` or a whole number of tokens (argparse names the flag on an error)."""
    if text.strip().lower() == "none":
        return None
    return int(text)


def add_tier_arguments(memory: argparse._ArgumentGroup) -> None:
    """The memory-tier flags (policies/tiers.py): the tiers, their write policy, the reuse
    threshold, the tier page size and load overlap."""
    from kvlab.policies.tiers import OVERLAP_MODES, WRITE_POLICIES

    memory.add_argument(
        "--kv-tiers", default="", metavar="TIERS",
        help="prefix-cache tiers below device memory, in order: KIND:SIZE[:OPTION=VALUE...] "
        "comma-separated, KIND host, ssd or remote, SIZE bytes (512GiB) or pages (4096p), "
        "options eviction=lru|fifo|lfu|arc|slru|cost, read=/write= GB/s, latency= us; e.g. "
        "host:512GiB,ssd:4TiB:eviction=arc (`+` separates tiers too; turns prefix caching on; "
        "default: none)")
    memory.add_argument(
        "--kv-tier-write", default="write-back", choices=WRITE_POLICIES,
        help="write-back: a page goes to the first tier when the device evicts it; "
        "write-through: as soon as its KV is computed (default write-back)")
    memory.add_argument(
        "--kv-tier-store-threshold", type=int, default=0, metavar="K",
        help="write to the tiers only pages hit at least K times (vLLM's reuse gating; "
        "default 0: every page)")
    memory.add_argument(
        "--kv-tier-block-size", type=int, default=None, metavar="TOKENS",
        help="tokens per tier page, a multiple of --block-size (vLLM's offloaded block_size, "
        "LMCache's chunk_size, e.g. 256): a tier page is written whole as it is computed "
        "(needs --kv-tier-write write-through) and loaded whole; fewer, larger tier entries "
        "(default: one device page)")
    memory.add_argument(
        "--kv-tier-overlap", default="none", choices=OVERLAP_MODES,
        help="none: a step computes after its tier loads; layerwise: loads stream under the "
        "forward pass layer by layer (default none)")


def tiers_config(args: argparse.Namespace) -> Any:
    """The TiersConfig of the tier flags (no tiers when the command has none)."""
    from kvlab.policies.tiers import TiersConfig, parse_tiers

    if not getattr(args, "kv_tiers", ""):
        return TiersConfig()
    return TiersConfig(parse_tiers(args.kv_tiers), write_policy=args.kv_tier_write,
                       store_threshold=args.kv_tier_store_threshold,
                       overlap=args.kv_tier_overlap, block_size=args.kv_tier_block_size)


def serving_config(args: argparse.Namespace, policy: str | None = None) -> Any:
    """The ServingConfig the flags of `add_serving_arguments` describe (`policy` instead of
    --policy: one of --compare's), resolved and checked once."""
    from kvlab.policies.serving import ServingConfig, parse_memory_size

    memory: dict[str, Any] = {}
    if hasattr(args, "swap_space_bytes"):
        memory["swap_space_bytes"] = parse_memory_size(args.swap_space_bytes, "swap_space_bytes",
                                                       bare_unit="gib")
    if getattr(args, "kv_cache_memory_bytes", None) is not None:
        memory["kv_cache_memory_bytes"] = parse_memory_size(args.kv_cache_memory_bytes)
    tiers = tiers_config(args)
    return ServingConfig.create(
        args.policy if policy is None else policy,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching or bool(tiers),
        kv_tiers=tiers,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_chunked_prefill=args.enable_chunked_prefill,
        scheduler_reserve_full_isl=bool(args.scheduler_reserve_full_isl),  # None: off
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
        scheduling_policy=getattr(args, "scheduling_policy", None) or "fcfs",
        prefix_cache_retention_interval=args.prefix_cache_retention_interval,
        hybrid_kv_cache_manager=args.hybrid_kv_cache_manager,
        seed=args.seed,
        **memory,
    )


def add_cluster_arguments(cluster: argparse._ArgumentGroup) -> None:
    """The simulated cluster's flags: how many instances of the machine, and the router that
    sends each request to one of them (checked when the run starts: `kvlab.sim.router`)."""
    from kvlab.sim.router import router_names  # the registry: no list of names here

    cluster.add_argument("--num-instances", type=int, default=1, metavar="N",
                         help="simulate N instances of the machine behind a router, each with "
                         "its own KV cache (default 1: one instance, no router)")
    cluster.add_argument("--router", default="round-robin", metavar="NAME",
                         help="which instance each request goes to, decided as it arrives: "
                         f"{', '.join(router_names())} (see README; default round-robin)")
    cluster.add_argument("--router-seed", type=int, default=0, metavar="S",
                         help="seed of a random router's draws (power-of-two; default 0)")
    cluster.add_argument("--pd", default=None, metavar="P:D",
                         help="prefill/decode disaggregation: P prefill instances (the router "
                         "picks among them) hand each request's KV to one of D decode "
                         "instances (the least loaded) over a link; sets --num-instances P+D")
    cluster.add_argument("--pd-link-bandwidth", type=float, default=None, metavar="GBPS",
                         help="GB/s of a prefill instance's link to the decode instances "
                         "(default: the hardware's RDMA figure, see kvlab presets)")
