"""Request traces: loaders for Azure, Mooncake, BurstGPT and ShareGPT files, a vLLM-style
synthetic `random` workload, arrival resampling, and bundled excerpts of real traces.

Every loader returns a `Trace` of `TraceRequest`s in arrival order; `load_trace` dispatches by
dataset name. Torch-free: numpy, pandas and the standard library only.
"""

from kvlab.traces.arrivals import RampUp, apply_arrivals, ramp_arrivals, resample_arrivals
from kvlab.traces.azure import load_azure
from kvlab.traces.bundled import bundled_trace_path, bundled_traces, resolve_trace_path
from kvlab.traces.burstgpt import load_burstgpt
from kvlab.traces.detect import guess_dataset_name
from kvlab.traces.lengths import scale_lengths
from kvlab.traces.loader import DATASET_NAMES, load_trace
from kvlab.traces.mooncake import load_mooncake
from kvlab.traces.prompts import synthesize_prompt_ids
from kvlab.traces.sharegpt import load_sharegpt
from kvlab.traces.stats import LengthStats, TraceInfo, format_info
from kvlab.traces.synthetic import RandomOptions, load_random
from kvlab.traces.types import Trace, TraceRequest
from kvlab.traces.windows import split_windows

__all__ = [
    "DATASET_NAMES",
    "LengthStats",
    "RampUp",
    "RandomOptions",
    "Trace",
    "TraceInfo",
    "TraceRequest",
    "apply_arrivals",
    "bundled_trace_path",
    "bundled_traces",
    "format_info",
    "guess_dataset_name",
    "load_azure",
    "load_burstgpt",
    "load_mooncake",
    "load_random",
    "load_sharegpt",
    "load_trace",
    "ramp_arrivals",
    "resample_arrivals",
    "resolve_trace_path",
    "scale_lengths",
    "split_windows",
    "synthesize_prompt_ids",
]
