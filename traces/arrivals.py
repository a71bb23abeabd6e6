"""Arrival times: replay a trace's timestamps, compress them, or resample them at a request rate.

Resampling follows vLLM's benchmark: the first request arrives at 0 and the gaps between requests
are gamma-distributed with shape = burstiness and scale = 1 / (request_rate * burstiness), so the
mean gap is 1 / request_rate; burstiness 1 is a Poisson process, below 1 burstier, above 1
more regular. An infinite rate sends every request at 0, as in vLLM. No rate (None) keeps the
trace's own timestamps, divided by `time_scale`: a choice vLLM's benchmark does not offer.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.types import Trace

# A separate random stream from the synthetic lengths': changing the rate never changes them.
_ARRIVAL_STREAM = 1


def check_arrival_options(request_rate: float | None, burstiness: float,
                          time_scale: float) -> None:
    """Raise a KvlabError naming the flag of the first bad arrival option."""
    if request_rate is not None and (not _is_real(request_rate) or math.isnan(request_rate)
                                     or request_rate <= 0):
        raise KvlabError(f"request_rate {request_rate!r}: expected requests per second > 0 "
                         "(inf sends every request at time 0)",
                         parameters=("request_rate",))
    if not _is_real(burstiness) or not math.isfinite(burstiness) or burstiness <= 0:
        raise KvlabError(f"burstiness {burstiness!r}: expected a finite number > 0 "
                         "(1 is a Poisson process)",
                         parameters=("burstiness",))
    if not _is_real(time_scale) or not math.isfinite(time_scale) or time_scale <= 0:
        raise KvlabError(f"time_scale {time_scale!r}: expected a finite number > 0 "
                         "(2 replays the trace twice as fast)",
                         parameters=("time_scale",))
    if request_rate is not None and time_scale != 1.0:
        raise KvlabError(f"time_scale {time_scale!r} with request_rate {request_rate!r}: "
                         "the time scale applies to trace timestamps, which a request rate "
                         "replaces; give only one of them",
                         parameters=("time_scale", "request_rate"))


def resample_arrivals(
    num_requests: int, *, request_rate: float, burstiness: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Seeded arrival times (seconds) of num_requests requests at request_rate, first at 0."""
    if math.isinf(request_rate) or num_requests == 0:
        return np.zeros(num_requests)
    rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness),
                     size=num_requests - 1)
    return np.concatenate(([0.0], np.cumsum(gaps)))


def apply_arrivals(
    trace: Trace,
    *,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    time_scale: float = 1.0,
    seed: int = 0,
) -> Trace:
    """The trace with arrivals resampled at request_rate (inf: all at 0), or its timestamps
    divided by time_scale (request_rate None).

    With the defaults the trace is returned unchanged. Request order and ids never change.
    """
    check_arrival_options(request_rate, burstiness, time_scale)
    if request_rate is None and time_scale == 1.0:
        return trace
    metadata = dict(trace.metadata)
    if request_rate is not None:
        arrivals = resample_arrivals(len(trace.requests), request_rate=request_rate,
                                     burstiness=burstiness, seed=seed)
        metadata.update(request_rate=request_rate, burstiness=burstiness, seed=seed)
    else:
        arrivals = np.array([r.arrival_s for r in trace.requests]) / time_scale
        metadata.update(time_scale=time_scale)
    requests = [dataclasses.replace(r, arrival_s=t)
                for r, t in zip(trace.requests, arrivals.tolist(), strict=True)]
    return Trace(trace.name, trace.dataset_name, trace.source, requests, metadata)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
