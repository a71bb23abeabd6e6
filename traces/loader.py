"""`load_trace`: one entry point for every dataset, with vLLM-benchmark-style arrival options."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.traces.arrivals import RampUp, apply_arrivals, check_arrival_options
from kvlab.traces.azure import load_azure
from kvlab.traces.build import check_num_prompts
from kvlab.traces.bundled import DEFAULT_EXCERPT, bundled_trace_path, resolve_trace_path
from kvlab.traces.burstgpt import load_burstgpt
from kvlab.traces.detect import guess_dataset_name
from kvlab.traces.lengths import scale_lengths
from kvlab.traces.mooncake import load_mooncake
from kvlab.traces.plain_csv import load_plain_csv
from kvlab.traces.sharegpt import load_sharegpt
from kvlab.traces.synthetic import RandomOptions, load_random
from kvlab.traces.types import Trace
from kvlab.traces.workload import load_workload

FILE_LOADERS: dict[str, Callable[..., Trace]] = {
    "azure": load_azure,
    "mooncake": load_mooncake,
    "burstgpt": load_burstgpt,
    "sharegpt": load_sharegpt,
    "csv": load_plain_csv,  # any time, input and output columns (traces/plain_csv.py)
}
DATASET_NAMES = (*FILE_LOADERS, "workload", "random")

# Options beyond the shared ones that each dataset accepts.
_OPTIONS: dict[str, tuple[str, ...]] = {
    "sharegpt": ("tokenizer",),
    "random": tuple(f.name for f in dataclasses.fields(RandomOptions)),
}


def load_trace(
    dataset_name: str | None,
    path: str | Path | None = None,
    *,
    num_prompts: int | None = None,
    seed: int = 0,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    time_scale: float = 1.0,
    ramp_up: RampUp | None = None,
    length_scale: int = 1,
    **options: Any,
) -> Trace:
    """Load a trace (or generate `random`) and set its arrivals.

    `dataset_name` None reads the format from the file (`guess_dataset_name`: its extension or
    CSV header); with no `path` either, the bundled Azure conversation excerpt.

    `path` may be a file or a bundled excerpt name (`azure-conv`, `azure-code`, `mooncake`),
    or for `workload` a workload spec (`kvlab.traces.workload`);
    without one, `azure` and `mooncake` load their bundled excerpt. `num_prompts` keeps the first
    N requests in arrival order (random: generates N, default 1000). Arrivals replay the trace's
    timestamps divided by `time_scale`, unless a `request_rate` resamples them (inf: all at 0)
    or a `ramp_up` raises the rate over the run (see `kvlab.traces.arrivals`);
    `length_scale` divides every length and the hash block size (`scale_lengths`). `options`:
    `tokenizer` for sharegpt, the `random_*` options and `num_prefix_groups` for random. Every
    user mistake is a KvlabError naming the flag.
    """
    if dataset_name is None:
        dataset_name = "azure" if path is None else guess_dataset_name(resolve_trace_path(path))
    if dataset_name not in DATASET_NAMES:
        raise KvlabError(f"dataset_name {dataset_name!r}: expected one of "
                         f"{', '.join(DATASET_NAMES)}",
                         parameters=("dataset_name",))
    _check_options(dataset_name, options)
    check_num_prompts(num_prompts)
    check_arrival_options(request_rate, burstiness, time_scale)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise KvlabError(f"seed {seed!r}: expected a whole number >= 0", parameters=("seed",))
    if dataset_name == "random":
        if path is not None:
            raise KvlabError(f"dataset_path {path}: dataset_name random generates its "
                             "requests and reads no file",
                             parameters=("dataset_path", "dataset_name"))
        trace = load_random(num_prompts=num_prompts, seed=seed, **options)
    elif dataset_name == "workload":
        trace = load_workload(_trace_file(dataset_name, path), num_prompts=num_prompts, seed=seed)
    else:
        file = _trace_file(dataset_name, path)
        trace = FILE_LOADERS[dataset_name](file, num_prompts=num_prompts, **options)
    trace = scale_lengths(trace, length_scale)
    return apply_arrivals(trace, request_rate=request_rate, burstiness=burstiness,
                          time_scale=time_scale, seed=seed, ramp_up=ramp_up)


def _trace_file(dataset_name: str, path: str | Path | None) -> Path:
    if path is not None:
        return resolve_trace_path(path)
    if dataset_name not in DEFAULT_EXCERPT:
        raise KvlabError(f"dataset_name {dataset_name} needs a dataset_path: no "
                         f"{dataset_name} excerpt is bundled",
                         parameters=("dataset_name", "dataset_path"))
    return bundled_trace_path(DEFAULT_EXCERPT[dataset_name])


def _check_options(dataset_name: str, options: dict[str, Any]) -> None:
    allowed = _OPTIONS.get(dataset_name, ())
    unknown = [name for name in options if name not in allowed]
    if unknown:
        expected = f"expected one of {', '.join(allowed)}" if allowed else "it takes none"
        raise KvlabError(f"option {unknown[0]!r} does not apply to dataset_name "
                         f"{dataset_name}; {expected}",
                         parameters=("dataset_name",))
