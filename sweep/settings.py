"""The settings a sweep varies: every setting of `kvlab sim` (named as its flag, without the
dashes: `--max-num-seqs` is `max_num_seqs`) plus the policy's own keys (`eviction`,
`preemption`, ...), each with one conversion and one check, and the key that names a run.

A setting's check is the library's own: each value is built into the object it configures
(a `PolicySpec`, a `ServingConfig`, a preset, the arrival options) with every other setting at
its default, so a value is rejected here for the reason `kvlab sim` would reject it. A value can
still fail in combination with others (a model too large for a device): that is a run's failure,
recorded in its row, not bad input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from kvlab.errors import KvlabError
from kvlab.metrics import parse_goodput, parse_metric_percentiles, parse_percentile_metrics
from kvlab.policies import PolicySpec, parse_policy
from kvlab.policies.scheduler import check_whole_number
from kvlab.policies.serving import ServingConfig, parse_memory_size
from kvlab.policies.tiers import TiersConfig, parse_tiers
from kvlab.sim.calibrated import load_cost_model
from kvlab.sim.disaggregation import parse_pd
from kvlab.sim.router import check_router
from kvlab.specs import get_hardware, get_model
from kvlab.traces import DATASET_NAMES, resolve_trace_path
from kvlab.traces.arrivals import RAMP_UP_STRATEGIES, check_arrival_options

# Where a setting goes: the trace loader, the machine (SimConfig), the serving config, the
# policy spec's own keys, the memory tiers, the summary's options, or the cluster
# (simulate_cluster).
GROUPS = ("trace", "machine", "serving", "policy", "tiers", "summary", "cluster")


@dataclass(frozen=True, slots=True)
class Setting:
    """One sweepable setting: where it goes, how a value is read, and how it is checked.

    `convert` turns a YAML value or a command-line text into the setting's type (a ValueError
    saying what it expected when it cannot); `check` raises a KvlabError for a value the
    library rejects. `sweepable` is False for the summary's options, which shape every row's
    columns and are set once for the whole sweep.
    """

    name: str
    group: str
    convert: Callable[[Any], Any]
    check: Callable[[Any], object] | None = None
    sweepable: bool = True


def _int(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise ValueError("expected a whole number")


def _float(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError("expected a number")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError("expected true or false")


def _str(value: Any) -> str:
    if isinstance(value, (dict, list, bool)) or value is None:
        raise ValueError("expected text")
    return str(value).strip()


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`convert`, with None (YAML null, or the text none/null) meaning unset."""

    def read(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        return convert(value)

    return read


def _text_list(value: Any) -> str:
    """A list given as YAML list or comma-separated text, as the flag's comma-separated text."""
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return _str(value)


def _goodput(value: Any) -> dict[str, float] | None:
    """SLOs as {metric: ms} from a YAML mapping, a list of KEY:MS, or text `ttft:500 tpot:50`."""
    if value is None:
        return None
    if isinstance(value, dict):
        items = [f"{key}:{ms}" for key, ms in value.items()]
    elif isinstance(value, list):
        items = [str(item) for item in value]
    else:
        items = str(value).replace(",", " ").split()
    return parse_goodput(items)


def _swap_space(value: Any) -> int:
    return parse_memory_size(value if isinstance(value, (int, str)) else _str(value),
                             "swap_space_bytes", bare_unit="gib")


def _kv_cache_memory(value: Any) -> int | None:
    if value is None or value == "none":
        return None
    return parse_memory_size(value if isinstance(value, (int, str)) else _str(value))


def _policy_key(name: str) -> Callable[[Any], object]:
    return lambda value: PolicySpec(**{name: value})


def _serving_field(name: str) -> Callable[[Any], object]:
    return lambda value: ServingConfig(**{name: value})


def _whole(name: str, low: int) -> Callable[[Any], object]:
    return lambda value: check_whole_number(name, value, low)


def _optional_whole(name: str, low: int) -> Callable[[Any], object]:
    return lambda value: None if value is None else check_whole_number(name, value, low)


def _choice(name: str, choices: tuple[str, ...] | list[str]) -> Callable[[Any], object]:
    def check(value: Any) -> None:
        if value not in choices:
            raise KvlabError(f"{name} {value!r}: expected one of {', '.join(choices)}",
                             parameters=(name,))

    return check


def _positive(name: str, *, finite: bool = True) -> Callable[[Any], object]:
    def check(value: Any) -> None:
        if math.isnan(value) or value <= 0 or (finite and math.isinf(value)):
            raise KvlabError(f"{name} {value!r}: expected a number > 0", parameters=(name,))

    return check


def _fraction(name: str) -> Callable[[Any], object]:
    def check(value: Any) -> None:
        if not 0.0 <= value <= 1.0:
            raise KvlabError(f"{name} {value!r}: expected a share in [0, 1]", parameters=(name,))

    return check


def _settings() -> dict[str, Setting]:
    optional_int, optional_float = _optional(_int), _optional(_float)
    table = [
        # the workload (kvlab.traces.load_trace)
        Setting("dataset_name", "trace", _str, _choice("dataset_name", DATASET_NAMES)),
        Setting("dataset_path", "trace", _optional(_str),
                resolve_trace_path),
        Setting("num_prompts", "trace", optional_int, _whole("num_prompts", 1)),
        Setting("request_rate", "trace", optional_float,
                lambda v: check_arrival_options(v, 1.0, 1.0)),
        Setting("burstiness", "trace", _float, lambda v: check_arrival_options(None, v, 1.0)),
        Setting("time_scale", "trace", _float, lambda v: check_arrival_options(None, 1.0, v)),
        Setting("length_scale", "trace", _int, _whole("length_scale", 1)),
        Setting("ramp_up_strategy", "trace", _optional(_str),
                _choice("ramp_up_strategy", RAMP_UP_STRATEGIES)),
        Setting("ramp_up_start_rps", "trace", optional_float, _positive("ramp_up_start_rps")),
        Setting("ramp_up_end_rps", "trace", optional_float, _positive("ramp_up_end_rps")),
        Setting("seed", "trace", _int, _whole("seed", 0)),
        Setting("tokenizer", "trace", _optional(_str)),
        Setting("random_input_len", "trace", optional_int, _whole("random_input_len", 1)),
        Setting("random_output_len", "trace", optional_int, _whole("random_output_len", 1)),
        Setting("random_range_ratio", "trace", optional_float, _fraction("random_range_ratio")),
        Setting("random_prefix_len", "trace", optional_int, _whole("random_prefix_len", 0)),
        Setting("num_prefix_groups", "trace", optional_int, _whole("num_prefix_groups", 1)),
        # the machine (kvlab.sim.SimConfig)
        Setting("model", "machine", _str, get_model),
        Setting("hardware", "machine", _str, get_hardware),
        Setting("tensor_parallel_size", "machine", _int, _whole("tensor_parallel_size", 1)),
        Setting("cost_model", "machine", _optional(_str), load_cost_model),
        # the serving config (kvlab.policies.serving.ServingConfig.create)
        Setting("policy", "serving", _str, parse_policy),
        Setting("block_size", "serving", optional_int, _policy_key("block_size")),
        Setting("enable_prefix_caching", "serving", _bool),
        Setting("prefix_cache_retention_interval", "serving", optional_int,
                _optional_whole("prefix_cache_retention_interval", 0)),
        Setting("hybrid_kv_cache_manager", "serving", _bool),
        Setting("max_num_seqs", "serving", _int, _serving_field("max_num_seqs")),
        Setting("max_num_batched_tokens", "serving", _int,
                _serving_field("max_num_batched_tokens")),
        Setting("enable_chunked_prefill", "serving", _bool),
        Setting("scheduler_reserve_full_isl", "serving", _bool),
        Setting("max_model_len", "serving", optional_int, _serving_field("max_model_len")),
        Setting("gpu_memory_utilization", "serving", _float,
                _serving_field("gpu_memory_utilization")),
        Setting("num_gpu_blocks_override", "serving", optional_int,
                _serving_field("num_gpu_blocks_override")),
        Setting("kv_cache_memory_bytes", "serving", _kv_cache_memory,
                _serving_field("kv_cache_memory_bytes")),
        Setting("swap_space_bytes", "serving", _swap_space),
        Setting("kv_cache_dtype", "serving", _str, _serving_field("kv_cache_dtype")),
        Setting("scheduling_policy", "serving", _str, _serving_field("scheduling_policy")),
        # the policy's own keys, applied over the policy spec (kvlab policies)
        Setting("reserve", "policy", _str, _policy_key("reserve")),
        Setting("block_sizing", "policy", _str, _policy_key("block_sizing")),
        Setting("eviction", "policy", _str, _policy_key("eviction")),
        Setting("preemption", "policy", _str, _policy_key("preemption")),
        Setting("victim", "policy", _str, _policy_key("victim")),
        Setting("watermark", "policy", _float, _policy_key("watermark")),
        Setting("host_pages", "policy", optional_int, _policy_key("host_pages")),
        # the memory tiers below the device (kvlab.policies.tiers; "none": no tier)
        Setting("kv_tiers", "tiers", _str, parse_tiers),
        Setting("kv_tier_write", "tiers", _str, lambda v: TiersConfig(write_policy=v)),
        Setting("kv_tier_store_threshold", "tiers", _int,
                lambda v: TiersConfig(store_threshold=v)),
        Setting("kv_tier_overlap", "tiers", _str, lambda v: TiersConfig(overlap=v)),
        Setting("kv_tier_block_size", "tiers", optional_int,
                lambda v: TiersConfig(block_size=v)),
        # the summary's options: the same for every run of a sweep
        Setting("percentile_metrics", "summary", _text_list, parse_percentile_metrics,
                sweepable=False),
        Setting("metric_percentiles", "summary", _text_list, parse_metric_percentiles,
                sweepable=False),
        Setting("goodput", "summary", _goodput, sweepable=False),
        # the SLO class whose requests the goodput attainment counts (kvlab tune --slo-class)
        Setting("slo_class", "summary", _optional(_str), sweepable=False),
        # the cluster (kvlab.sim.simulate_cluster): one instance unless num_instances > 1
        Setting("num_instances", "cluster", _int, _whole("num_instances", 1)),
        Setting("router", "cluster", _str, check_router),
        Setting("router_seed", "cluster", _int, _whole("router_seed", 0)),
        # prefill/decode disaggregation ("P:D", or "none"; kvlab.sim.disaggregation), its
        # link in GB/s
        Setting("pd", "cluster", _optional(_str), lambda v: v == "none" or parse_pd(v)),
        Setting("pd_link_bandwidth", "cluster", optional_float,
                _positive("pd_link_bandwidth")),
    ]
    return {setting.name: setting for setting in table}


SETTINGS: dict[str, Setting] = _settings()


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
