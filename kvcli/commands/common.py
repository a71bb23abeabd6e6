"""Flags and helpers shared by the commands that replay a trace (`sim`, `run`, `validate`):
the workload, the serving config and the report."""

from __future__ import annotations

import argparse
import sys
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


_WORKLOAD = ("dataset_name", "dataset_path", "num_prompts", "request_rate", "burstiness",
             "time_scale", "length_scale", "ramp_up_strategy", "ramp_up_start_rps",
             "ramp_up_end_rps", "seed", *_SYNTHETIC_OPTIONS)
_MACHINE = ("model", "hardware", "tensor_parallel_size", "cost_model")
_SERVING_POLICY = ("block_size", "enable_prefix_caching", "max_num_seqs", "max_num_batched_tokens",
                   "enable_chunked_prefill", "scheduling_policy", "scheduler_reserve_full_isl")
_SERVING_MEMORY = ("max_model_len", "gpu_memory_utilization", "num_gpu_blocks_override",
                   "kv_cache_memory_bytes", "kv_cache_dtype")
_TIERS = ("kv_tiers", "kv_tier_write", "kv_tier_store_threshold", "kv_tier_block_size",
          "kv_tier_overlap")
_KV_GROUPS = ("prefix_cache_retention_interval", "hybrid_kv_cache_manager")
_REPORT = ("percentile_metrics", "metric_percentiles", "goodput")
_CLUSTER = ("num_instances", "router", "router_seed", "pd", "pd_link_bandwidth")


def add_setting_arguments(group: argparse._ActionsContainer, names: tuple[str, ...],
                          **changes: dict[str, Any]) -> None:
    """The flags of settings `names`, made from their one declaration (kvlab.sweep.settings's
    table), in that order; `changes` gives a setting a command's own default or help
    (`num_prompts={"default": 1000, "help": "..."}`)."""
    from kvlab.sweep.settings import SETTINGS

    for name in names:
        setting = SETTINGS[name]
        assert setting.flag is not None, f"setting {name} has no flag"
        options: dict[str, Any] = {"dest": name, "default": setting.default,
                                   "help": setting.help_text()}
        if setting.action == "switch":
            options["action"] = "store_true"
        elif setting.action == "off":
            options["action"] = "store_false"
            del options["default"]
        elif setting.action == "toggle":
            options["action"] = argparse.BooleanOptionalAction
        else:
            if setting.action == "list":
                options["nargs"] = "+"
            if setting.cli_type is not None:
                options["type"] = setting.cli_type
            if setting.choices is not None:
                options["choices"] = setting.choices()
            if setting.metavar is not None:
                options["metavar"] = setting.metavar
        options.update(changes.get(name, {}))
        group.add_argument(setting.flag, *setting.aliases, **options)


def add_workload_arguments(
    data: argparse._ArgumentGroup, *, num_prompts: int | None, num_prompts_help: str, seed_help: str
) -> None:
    """vLLM's benchmark workload flags, plus --time-scale and the `random` dataset options."""
    add_setting_arguments(data, _WORKLOAD,
                          num_prompts={"default": num_prompts, "help": num_prompts_help},
                          seed={"help": seed_help})


def add_machine_arguments(machine: argparse._ArgumentGroup) -> None:
    """The simulated machine's flags (`kvlab sim`, `sweep`, `tune`): model, hardware,
    tensor parallelism and the cost model."""
    add_setting_arguments(machine, _MACHINE)


def add_report_arguments(out: argparse._ArgumentGroup, *, save_help: str = "",
                         files: bool = True) -> None:
    """vLLM's report and result-file flags (`files` False: the report's flags only)."""
    add_setting_arguments(out, _REPORT)
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
    machine.add_argument("--cpu-gemm", default="onednn", choices=("onednn", "torch"),
                         help="CPU matmuls of decode-sized batches: onednn (on a packed copy of "
                         "each weight: faster, a second copy of the linear weights in memory) "
                         "or torch (F.linear only) (default onednn)")


def show_progress(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: unless --disable-tqdm, and only on a terminal."""
    import sys

    return not args.disable_tqdm and sys.stderr.isatty()


def summary_options(args: argparse.Namespace) -> dict[str, Any]:
    """`kvlab.metrics.summarize`'s keyword arguments from the report flags, parsed now so a bad
    flag fails before the run (as a sweep reads the same settings)."""
    from kvlab.sweep.runner import summary_options as from_settings

    return from_settings(_settings_of(args, "summary"))


def load_trace_from_args(args: argparse.Namespace) -> Any:
    """The trace the workload flags describe, loaded as a sweep loads the same settings
    (kvlab.sweep.runner.load_settings_trace)."""
    from kvlab.sweep.runner import load_settings_trace

    return load_settings_trace(_settings_of(args, "trace"))


def _settings_of(args: argparse.Namespace, *groups: str) -> dict[str, Any]:
    """The settings of `groups` that the command's flags set (None: unset), each read by its
    setting's reader (the table of kvlab.sweep.settings)."""
    from kvlab.sweep.settings import SETTINGS

    return {name: setting.convert(getattr(args, name)) for name, setting in SETTINGS.items()
            if setting.group in groups and getattr(args, name, None) is not None}


def add_serving_arguments(
    policy: argparse._ArgumentGroup,
    memory: argparse._ArgumentGroup,
    *,
    compare: bool = False,
    engine: bool = False,
    preset: bool = True,
) -> None:
    """The serving config's flags (vLLM's names), one group for every command that runs an
    instance: `--policy` (or, with `compare`, `--compare SPEC ...` instead), page size, prefix
    caching, batch limits, model length, KV memory sizing and the host swap space; `engine`
    adds the engine's cpu default of `--kv-cache-memory` to its help; `preset` adds `--preset`
    (the serving engine's defaults for what is left unset; not where a command's own --preset
    names a server's). Defaults are `ServingConfig`'s. The dests are ServingConfig's field
    names, so that the CLI can name the flag of a setting a library error speaks of."""
    from kvlab.sweep.settings import SETTINGS

    spec_help = ("memory policy, e.g. paged:block_size=16,eviction=lru,preemption=swap "
                 "(see `kvlab policies`; default paged)")
    default = SETTINGS["policy"].default
    if compare:
        which = policy.add_mutually_exclusive_group()
        which.add_argument("--policy", default=default, metavar="SPEC", help=spec_help)
        which.add_argument(
            "--compare", nargs="+", default=None, metavar="SPEC",
            help="simulate each policy on the same trace; print them side by side",
        )
    else:
        policy.add_argument("--policy", default=default, metavar="SPEC", help=spec_help)
    add_setting_arguments(policy, (*_SERVING_POLICY, "preset") if preset else _SERVING_POLICY)
    engine_size = {"help": SETTINGS["kv_cache_memory_bytes"].help_text().replace(
        "default from", f"default on cpu: {DEFAULT_CPU_KV_CACHE_MEMORY}; on gpu/npu: from")}
    add_setting_arguments(memory, (*_SERVING_MEMORY, *_TIERS, *_KV_GROUPS, "swap_space_bytes"),
                          kv_cache_memory_bytes=engine_size if engine else {})


def add_kv_cache_dtype_argument(memory: argparse._ActionsContainer) -> None:
    """`--kv-cache-dtype` with vLLM's names (`kvlab.specs.kv_dtype`; the dest is
    ServingConfig's field)."""
    add_setting_arguments(memory, ("kv_cache_dtype",))


def serving_config(args: argparse.Namespace, policy: str | None = None) -> Any:
    """The ServingConfig the flags of `add_serving_arguments` describe (`policy` instead of
    --policy: one of --compare's), resolved and checked once, as a sweep builds it from the
    same settings (kvlab.sweep.runner.serving_config). A flag left unset (None) keeps
    ServingConfig's default; the tier flags count only with --kv-tiers."""
    from kvlab.sweep.runner import serving_config as from_settings

    groups = ("serving", "tiers") if getattr(args, "kv_tiers", "") else ("serving",)
    settings = _settings_of(args, *groups)
    settings["policy"] = args.policy if policy is None else policy
    settings["seed"] = args.seed
    return from_settings(settings)


def server_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The serving settings the flags give for a server's simulator, over its preset's (a
    vLLM run with --no-scheduler-reserve-full-isl, or one older than 0.32, has no gate; a
    vLLM started with --scheduling-policy priority does not export it)."""
    return {"scheduler_reserve_full_isl": args.scheduler_reserve_full_isl,
            "scheduling_policy": getattr(args, "scheduling_policy", None),
            "prefix_cache_retention_interval": getattr(
                args, "prefix_cache_retention_interval", None)}


def add_cluster_arguments(cluster: argparse._ArgumentGroup) -> None:
    """The simulated cluster's flags: how many instances of the machine, and the router that
    sends each request to one of them (checked when the run starts: `kvlab.sim.router`)."""
    add_setting_arguments(cluster, _CLUSTER)


def config_warnings(config: Any) -> list[str]:
    """What a simulated machine's config should tell its user before a run (`sim`, each
    distinct one of a `sweep`): a page size or KV dtype that the hardware's vLLM would not
    run, a host tier larger than the host memory, a cost model fitted for another model or
    fitted poorly."""
    from kvlab.specs.block_rules import block_size_warnings, platform_of
    from kvlab.specs.kv_dtype import kv_cache_dtype, platform_warnings

    policy, layout = config.policy, config.capacity.layout
    # the size asked for: a raised one (a linear-attention state) is vLLM's own choice
    block_size = policy.block_size if layout is None else layout.requested_block_size
    dtype = config.serving.kv_cache_dtype
    warnings = block_size_warnings(
        config.hardware_spec, block_size, enable_prefix_caching=policy.prefix_caching,
        enable_chunked_prefill=config.serving.enable_chunked_prefill, kv_cache_dtype=dtype)
    warnings += platform_warnings(kv_cache_dtype(dtype), platform_of(config.hardware_spec))
    warnings += [f"--kv-tiers: {warning}" for warning in config.tier_warnings()]
    warnings += policy_warnings(policy)
    if config.calibrated is None:
        return warnings
    from kvlab.fidelity.calibration import fit_warnings, mismatch_warning

    where = f"--cost-model {config.cost_model}"
    mismatch = mismatch_warning(config.calibrated, config.model_spec.name, where)
    warnings += [mismatch] if mismatch else []
    return warnings + [f"{where}: {warning}" for warning in fit_warnings(config.calibrated)]


def policy_warnings(policy: Any) -> list[str]:
    """What a policy (a `PolicySpec`) should tell its user before it runs, simulated or on
    the engine (`kvlab sim`, `sweep`, `run`, `serve`): swapping, which vLLM V1 never does,
    and precision settings that act on nothing."""
    warnings = []
    if policy.preemption == "swap":
        warnings.append("preemption=swap: vLLM V1 never swaps, it recomputes; swapping is "
                        "vLLM V0's (--preset vllm-v0 gives its other defaults)")
    return warnings + _precision_warnings(policy)


def print_warnings(warnings: list[str]) -> None:
    """Each of `warnings` on stderr, as `warning: ...`."""
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _precision_warnings(policy: Any) -> list[str]:
    """A precision policy's settings that act on prefix-cache pages, given without prefix
    caching (they then do nothing; `cached=1` is the default and says nothing unless given)."""
    from kvlab.policies.params import split_spec

    if policy.prefix_caching:
        return []
    _, items = split_spec(policy.precision, "precision")
    given = [f"{key}={value}" for key, value in items
             if key in ("cached", "recompute") and value.strip() not in ("0", "0.0")]
    if not given:
        return []
    return [f"precision {', '.join(given)}: acts on prefix-cache pages, and prefix caching is "
            "off (--enable-prefix-caching, or an eviction policy other than none): it does "
            "nothing here"]
