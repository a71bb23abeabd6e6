"""The one table of a run's settings: every setting of `kvlab sim` (named as its flag, without
the dashes: `--max-num-seqs` is `max_num_seqs`) plus the policy's own keys (`eviction`,
`preemption`, ...), each declared once with its flag, default, help, conversion and check.
`kvlab`'s flags (kvcli/commands/common.py), a sweep's settings and the dashboard's widgets are
made from it; `run_key` names a run by its settings.

A setting's check is the library's own: each value is built into the object it configures
(a `PolicySpec`, a `ServingConfig`, a preset, the arrival options) with every other setting at
its default, so a value is rejected here for the reason `kvlab sim` would reject it. A value can
still fail in combination with others (a model too large for a device): that is a run's failure,
recorded in its row, not bad input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xxhash

from kvlab.errors import KvlabError
from kvlab.metrics import parse_metric_percentiles, parse_percentile_metrics
from kvlab.policies import parse_policy
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import AUTO_BLOCK, OVERLAP_MODES, WRITE_POLICIES, TiersConfig, parse_tiers
from kvlab.sim.calibrated import load_cost_model
from kvlab.sim.disaggregation import parse_pd
from kvlab.sim.router import check_router
from kvlab.specs import DEFAULT_HARDWARE, DEFAULT_MODEL, get_hardware, get_model
from kvlab.sweep.setting_types import (
    Setting,
    as_bool,
    as_float,
    as_int,
    as_str,
    choice,
    flag_of,
    fraction,
    goodput_slos,
    kv_cache_memory,
    optional,
    optional_whole,
    policy_key,
    positive,
    serving_field,
    swap_space,
    text_list,
    tier_block_size,
    tier_block_text,
    whole,
)
from kvlab.traces import DATASET_NAMES, resolve_trace_path
from kvlab.traces.arrivals import RAMP_UP_STRATEGIES, check_arrival_options

_SERVING = ServingConfig()  # the serving settings' defaults


def _flagged(name: str, group: str, convert: Any, check: Any = None, **cli: Any) -> Setting:
    """A setting with a command-line flag (its name with dashes unless `flag` says)."""
    return Setting(name, group, convert, check, flag=cli.pop("flag", flag_of(name)), **cli)


def _scheduling_help() -> str:
    from kvlab.policies import registry

    described = "; ".join(f"{e.name}: {e.help}" for e in registry.entries()
                          if e.family == "scheduling")
    return (f"the order waiting requests are admitted in, NAME[:key=value,...] ({described}; "
            "default fcfs, and against a server (validate --base-url) the one kvlab serve "
            "exports)")


def _kv_cache_dtype_help() -> str:
    from kvlab.specs.kv_dtype import KV_CACHE_DTYPES

    described = "; ".join(f"{d.name}: {d.help}" for d in KV_CACHE_DTYPES.values())
    return (f"the KV cache's precision, vLLM's names ({described}; fp8 = fp8_e4m3); pages "
            "are sized in its bytes, scales included (default auto)")


def _kv_cache_dtypes() -> list[str]:
    from kvlab.specs.kv_dtype import kv_cache_dtype_names

    return list(kv_cache_dtype_names())


def _router_help() -> str:
    from kvlab.sim.router import router_names

    return ("which instance each request goes to, decided as it arrives: "
            f"{', '.join(router_names())} (see README; default round-robin)")


def _retention_interval(text: str) -> int | None:
    """`None` or a whole number of tokens (argparse names the flag on an error)."""
    if text.strip().lower() == "none":
        return None
    return int(text)


def _workload() -> list[Setting]:
    """The workload (kvlab.traces.load_trace)."""
    optional_int, optional_float = optional(as_int), optional(as_float)
    return [
        _flagged("dataset_name", "trace", as_str, choice("dataset_name", DATASET_NAMES),
                 choices=lambda: DATASET_NAMES,
                 help="trace format, or random for vLLM's synthetic set (default: read from "
                 "--dataset-path, its extension or CSV header; without one, the bundled Azure "
                 "conversation excerpt)"),
        _flagged("dataset_path", "trace", optional(as_str), resolve_trace_path,
                 help="trace file or bundled excerpt name (azure-conv, azure-code, "
                 "mooncake); default: the dataset's bundled excerpt"),
        # (its default and help are each command's)
        _flagged("num_prompts", "trace", optional_int, whole("num_prompts", 1), cli_type=int),
        _flagged("request_rate", "trace", optional_float,
                 lambda v: check_arrival_options(v, 1.0, 1.0), cli_type=float,
                 help="resample arrivals at this many requests/s; inf sends every request at "
                 "0, as vLLM's benchmark does (default: replay the trace's timestamps; random: "
                 "all at 0)"),
        _flagged("burstiness", "trace", as_float, lambda v: check_arrival_options(None, v, 1.0),
                 cli_type=float, default=1.0,
                 help="gamma shape of resampled arrival gaps (default 1: Poisson)"),
        _flagged("time_scale", "trace", as_float, lambda v: check_arrival_options(None, 1.0, v),
                 cli_type=float, default=1.0,
                 help="divide trace timestamps by this to compress time (4: 4x the rate; "
                 "default 1)"),
        _flagged("length_scale", "trace", as_int, whole("length_scale", 1), cli_type=int,
                 default=1,
                 help="divide every prompt and output length, and a trace's hash block size, "
                 "by this: the same sharing on a smaller machine (16: Mooncake's 512-token "
                 "blocks as 32; default 1)"),
        _flagged("ramp_up_strategy", "trace", optional(as_str),
                 choice("ramp_up_strategy", RAMP_UP_STRATEGIES),
                 choices=lambda: RAMP_UP_STRATEGIES,
                 help="raise the request rate over the run, as vLLM's benchmark does, from "
                 "--ramp-up-start-rps to --ramp-up-end-rps (instead of --request-rate)"),
        _flagged("ramp_up_start_rps", "trace", optional_float, positive("ramp_up_start_rps"),
                 cli_type=float,
                 help="requests/s of the first request under --ramp-up-strategy"),
        _flagged("ramp_up_end_rps", "trace", optional_float, positive("ramp_up_end_rps"),
                 cli_type=float, help="requests/s of the last request under --ramp-up-strategy"),
        # (its help is each command's)
        _flagged("seed", "trace", as_int, whole("seed", 0), cli_type=int, default=0),
    ]


def _synthetic() -> list[Setting]:
    """The options of the generated datasets (random, sharegpt lengths)."""
    optional_int, optional_float = optional(as_int), optional(as_float)
    synthetic = [
        ("random_input_len", "random: prompt tokens (default 1024)", 1),
        ("random_output_len", "random: output tokens (default 128)", 1),
        ("random_prefix_len", "random: shared prefix tokens before each prompt", 0),
        ("num_prefix_groups", "random: requests share their prefix in this many groups", 1),
    ]
    return [
        _flagged("tokenizer", "trace", optional(as_str),
                 help="sharegpt: local Hugging Face tokenizer folder for exact lengths"),
        *[_flagged(name, "trace", optional_int, whole(name, low), cli_type=int, help=text)
          for name, text, low in synthetic[:2]],
        _flagged("random_range_ratio", "trace", optional_float, fraction("random_range_ratio"),
                 cli_type=float, help="random: lengths vary uniformly by this share"),
        *[_flagged(name, "trace", optional_int, whole(name, low), cli_type=int, help=text)
          for name, text, low in synthetic[2:]],
    ]


def _machine() -> list[Setting]:
    """The simulated machine (kvlab.sim.SimConfig)."""
    return [
        _flagged("model", "machine", as_str, get_model, default=DEFAULT_MODEL,
                 help="model preset, spec file or Hugging Face model folder (see `kvlab "
                 f"presets`; default {DEFAULT_MODEL})"),
        _flagged("hardware", "machine", as_str, get_hardware, default=DEFAULT_HARDWARE,
                 help=f"hardware preset or spec file (see `kvlab presets`; default "
                 f"{DEFAULT_HARDWARE})"),
        _flagged("tensor_parallel_size", "machine", as_int, whole("tensor_parallel_size", 1),
                 cli_type=int, default=1,
                 help="devices the model's layers are split over; each holds 1/N of the "
                 "weights and KV heads (default 1)"),
        _flagged("cost_model", "machine", optional(as_str), load_cost_model, metavar="FILE",
                 help="calibrated cost model from `kvlab calibrate` (default: the roofline of "
                 "--model and --hardware)"),
    ]


def _serving() -> list[Setting]:
    """The serving config (kvlab.policies.serving.ServingConfig.create); the flags' dests are
    ServingConfig's field names, so that the CLI can name the flag a library error speaks of."""
    optional_int = optional(as_int)
    return [
        # (its flag is made with --compare beside it)
        Setting("policy", "serving", as_str, parse_policy, default="paged"),
        _flagged("block_size", "serving", optional_int, policy_key("block_size"), cli_type=int,
                 help="tokens per page for every policy whose spec leaves block_size at its "
                 f"default ({_SERVING.page_size})"),
        _flagged("enable_prefix_caching", "serving", as_bool, action="switch", default=False,
                 help="cache full KV pages for prefix hits (eviction none becomes lru)"),
        _flagged("max_num_seqs", "serving", as_int, serving_field("max_num_seqs"), cli_type=int,
                 default=_SERVING.max_num_seqs,
                 help=f"most requests running in one step (default {_SERVING.max_num_seqs})"),
        _flagged("max_num_batched_tokens", "serving", as_int,
                 serving_field("max_num_batched_tokens"), cli_type=int,
                 default=_SERVING.max_num_batched_tokens,
                 help="token budget of one step, prefill chunks and decodes together (default "
                 f"{_SERVING.max_num_batched_tokens})"),
        _flagged("enable_chunked_prefill", "serving", as_bool, action="toggle",
                 default=_SERVING.enable_chunked_prefill,
                 help="split long prompts over steps within the token budget (default: on)"),
        _flagged("scheduling_policy", "serving", as_str, serving_field("scheduling_policy"),
                 metavar="SPEC", help=_scheduling_help),
        _flagged("scheduler_reserve_full_isl", "serving", as_bool, action="toggle",
                 help="admit a waiting request only when its whole prompt fits in KV memory, "
                 "not just its first chunk (vLLM V1's default: on; off with --preset vllm-v0)"),
        _flagged("preset", "serving", optional(as_str), choice("preset", _preset_names()),
                 choices=_preset_names, metavar="PRESET", help=_preset_help),
    ]


def _preset_names() -> list[str]:
    from kvlab.policies.serving_presets import SERVING_PRESETS

    return list(SERVING_PRESETS)


def _preset_help() -> str:
    from kvlab.policies.serving_presets import DEFAULT_SERVING_PRESET, SERVING_PRESETS

    described = "; ".join(f"{p.name}: {p.description}" for p in SERVING_PRESETS.values())
    return (f"the serving engine whose defaults fill the settings and policy keys left unset "
            f"({described}; default {DEFAULT_SERVING_PRESET})")


def _serving_memory() -> list[Setting]:
    """The serving config's memory sizing and KV-cache groups (ServingConfig's fields)."""
    optional_int = optional(as_int)
    return [
        _flagged("max_model_len", "serving", optional_int, serving_field("max_model_len"),
                 cli_type=int,
                 help="longest request (prompt + output); default: the model's; longer "
                 "requests fail"),
        _flagged("gpu_memory_utilization", "serving", as_float,
                 serving_field("gpu_memory_utilization"), cli_type=float,
                 default=_SERVING.gpu_memory_utilization,
                 help="share of device memory for weights, activations and KV cache (default "
                 f"{_SERVING.gpu_memory_utilization})"),
        _flagged("num_gpu_blocks_override", "serving", optional_int,
                 serving_field("num_gpu_blocks_override"), cli_type=int,
                 help="KV pages per device, whatever the memory says"),
        # (the engine commands say their cpu default in its help)
        _flagged("kv_cache_memory_bytes", "serving", kv_cache_memory,
                 serving_field("kv_cache_memory_bytes"), flag="--kv-cache-memory",
                 aliases=("--kv-cache-memory-bytes",), metavar="SIZE",
                 help="KV cache size per device, e.g. 256MiB or 2GiB, as vLLM's "
                 "--kv-cache-memory-bytes (--num-gpu-blocks-override wins; default from "
                 "--gpu-memory-utilization)"),
        _flagged("kv_cache_dtype", "serving", as_str, serving_field("kv_cache_dtype"),
                 default="auto", choices=_kv_cache_dtypes, metavar="DTYPE",
                 help=_kv_cache_dtype_help),
        _flagged("prefix_cache_retention_interval", "serving", optional_int,
                 optional_whole("prefix_cache_retention_interval", 0),
                 cli_type=_retention_interval, metavar="TOKENS",
                 help="sliding-window and state groups with prefix caching: cache only the "
                 "pages a prefix hit can use, a hit at a prompt's end and (TOKENS > 0) at each "
                 "multiple of TOKENS, freeing the rest at once (vLLM's flag; a multiple of "
                 "--block-size; 0 is vLLM 0.32's default; default here: None, every page "
                 "cached)"),
        _flagged("hybrid_kv_cache_manager", "serving", as_bool, action="off", default=True,
                 flag="--disable-hybrid-kv-cache-manager",
                 help="sliding and chunked attention layers keep every token, as full "
                 "attention (vLLM's flag: one KV-cache group, the plain manager)"),
        _flagged("swap_space_bytes", "serving", swap_space, flag="--swap-space", default="4",
                 metavar="GiB",
                 help="host memory per device for swapped-out pages (preemption=swap: vLLM "
                 "V0's --swap-space; V1 never swaps), in GiB (4 = 4 GiB) or a size such as "
                 "512MiB; the policy's host_pages, a page count, wins (default 4)"),
    ]


def _policy_keys() -> list[Setting]:
    """The policy's own keys, applied over the policy spec (kvlab policies); no flags: the
    spec string (--policy) says them."""
    return [
        Setting("reserve", "policy", as_str, policy_key("reserve")),
        Setting("block_sizing", "policy", as_str, policy_key("block_sizing")),
        Setting("eviction", "policy", as_str, policy_key("eviction")),
        Setting("preemption", "policy", as_str, policy_key("preemption")),
        Setting("victim", "policy", as_str, policy_key("victim")),
        Setting("watermark", "policy", as_float, policy_key("watermark")),
        Setting("host_pages", "policy", optional(as_int), policy_key("host_pages")),
        Setting("precision", "policy", as_str, policy_key("precision")),
    ]


def _tiers() -> list[Setting]:
    """The memory tiers below the device (kvlab.policies.tiers; "none": no tier)."""
    return [
        _flagged("kv_tiers", "tiers", as_str, parse_tiers, default="", metavar="TIERS",
                 help="prefix-cache tiers below device memory, in order: KIND:SIZE[:OPTION="
                 "VALUE...] comma-separated, KIND host, ssd or remote, SIZE bytes (512GiB) or "
                 "pages (4096p), options eviction=lru|fifo|lfu|arc|slru|cost, read=/write= GB/s, "
                 "latency= us; e.g. host:512GiB,ssd:4TiB:eviction=arc (`+` separates tiers "
                 "too; turns prefix caching on; default: none)"),
        _flagged("kv_tier_write", "tiers", as_str, lambda v: TiersConfig(write_policy=v),
                 default="write-back", choices=lambda: WRITE_POLICIES,
                 help="write-back: a page goes to the first tier when the device evicts it; "
                 "write-through: as soon as its KV is computed (default write-back)"),
        _flagged("kv_tier_store_threshold", "tiers", as_int,
                 lambda v: TiersConfig(store_threshold=v), cli_type=int, default=0, metavar="K",
                 help="write to the tiers only pages hit at least K times (vLLM's reuse "
                 "gating; default 0: every page)"),
        _flagged("kv_tier_block_size", "tiers", tier_block_size, lambda v: TiersConfig(
            block_size=v), cli_type=tier_block_text, default=AUTO_BLOCK, metavar="TOKENS",
                 help="tokens per tier page, written and loaded whole (vLLM's offloaded "
                 "block_size), a multiple of --block-size; none: one device page; auto (default):"
                 " up to 512 where prompts share prefixes in hash blocks it divides (Mooncake's)"),
        _flagged("kv_tier_overlap", "tiers", as_str, lambda v: TiersConfig(overlap=v),
                 default="none", choices=lambda: OVERLAP_MODES,
                 help="none: a step computes after its tier loads; layerwise: loads stream "
                 "under the forward pass layer by layer (default none)"),
    ]


def _summary() -> list[Setting]:
    """The summary's options: the same for every run of a sweep."""
    return [
        _flagged("percentile_metrics", "summary", text_list, parse_percentile_metrics,
                 sweepable=False, default="ttft,tpot,itl",
                 help="metrics with percentiles: any of ttft,tpot,itl,e2el (default "
                 "ttft,tpot,itl)"),
        _flagged("metric_percentiles", "summary", text_list, parse_metric_percentiles,
                 sweepable=False, default="99",
                 help="percentiles to report, e.g. 50,90,99 (default 99)"),
        _flagged("goodput", "summary", goodput_slos, sweepable=False, action="list",
                 metavar="KEY:MS", help="SLOs for request goodput, e.g. ttft:500 tpot:50"),
        # the SLO class whose requests the goodput attainment counts (kvlab tune --slo-class)
        Setting("slo_class", "summary", optional(as_str), sweepable=False),
    ]


def _cluster() -> list[Setting]:
    """The cluster (kvlab.sim.simulate_cluster): one instance unless num_instances > 1."""
    return [
        _flagged("num_instances", "cluster", as_int, whole("num_instances", 1), cli_type=int,
                 default=1, metavar="N",
                 help="simulate N instances of the machine behind a router, each with its own "
                 "KV cache (default 1: one instance, no router)"),
        _flagged("router", "cluster", as_str, check_router, default="round-robin",
                 metavar="NAME", help=_router_help),
        _flagged("router_seed", "cluster", as_int, whole("router_seed", 0), cli_type=int,
                 default=0, metavar="S",
                 help="seed of a random router's draws (power-of-two; default 0)"),
        # prefill/decode disaggregation ("P:D", or "none"; kvlab.sim.disaggregation)
        _flagged("pd", "cluster", optional(as_str), lambda v: v == "none" or parse_pd(v),
                 metavar="P:D",
                 help="prefill/decode disaggregation: P prefill instances (the router picks "
                 "among them) hand each request's KV to one of D decode instances (the least "
                 "loaded) over a link; sets --num-instances P+D"),
        _flagged("pd_link_bandwidth", "cluster", optional(as_float),
                 positive("pd_link_bandwidth"), cli_type=float, metavar="GBPS",
                 help="GB/s of a prefill instance's link to the decode instances (default: "
                 "the hardware's RDMA figure, see kvlab presets)"),
    ]


SETTINGS: dict[str, Setting] = {
    setting.name: setting
    for setting in (*_workload(), *_synthetic(), *_machine(), *_serving(), *_serving_memory(),
                    *_policy_keys(), *_tiers(), *_summary(), *_cluster())
}


def setting_value(name: str, value: Any) -> Any:
    """`value` read and checked as setting `name`; a KvlabError about the setting when the name
    is unknown or the value is not one the setting takes."""
    setting = SETTINGS.get(name)
    if setting is None:
        raise KvlabError(f"unknown setting {name!r}; sweepable settings are the flags of "
                         f"`kvlab sim` and the policy keys: {', '.join(SETTINGS)}")
    try:
        converted = setting.convert(value)
    except ValueError as err:
        raise KvlabError(f"{name} {value!r}: {err}", parameters=(name,)) from None
    if setting.check is not None and converted is not None:
        setting.check(converted)
    return converted


def check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting read and checked (`setting_value`), in the order given."""
    return {name: setting_value(name, value) for name, value in settings.items()}


def run_key(settings: Mapping[str, Any]) -> str:
    """A stable digest naming one run: the same checked settings give the same key, in any
    order; resumed sweeps skip the runs whose key is already stored."""
    text = json.dumps(dict(sorted(settings.items())), sort_keys=True, default=str,
                      allow_nan=True, separators=(",", ":"))
    return xxhash.xxh3_128_hexdigest(text.encode())
