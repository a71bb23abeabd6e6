"""Arrival times: replay a trace's timestamps, compress them, or resample them at a request rate.

Resampling follows vLLM's benchmark: the first request arrives at 0 and the gaps between requests
are gamma-distributed with shape = burstiness and scale = 1 / (request_rate * burstiness), so the
mean gap is 1 / request_rate; burstiness 1 is a Poisson process, below 1 burstier, above 1
more regular. An infinite rate sends every request at 0, as in vLLM. No rate (None) keeps the
trace's own timestamps, divided by `time_scale`: a choice vLLM's benchmark does not offer.
A ramp-up (vLLM's `--ramp-up-strategy`) raises the rate from a start to an end over the run,
linearly or exponentially in the request index; each gap is drawn at the current rate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.types import Trace

# A separate random stream from the synthetic lengths': changing the rate never changes them.
_ARRIVAL_STREAM = 1


@dataclass(slots=True, frozen=True)
class RampUp:
    """vLLM's ramp-up: request i is sent at the rate start + (end - start) * i / (n - 1)
    (linear) or start * (end / start) ** (i / (n - 1)) (exponential), in requests/s."""

    strategy: str
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        if self.strategy not in RAMP_UP_STRATEGIES:
            raise KvlabError(f"ramp_up_strategy {self.strategy!r}: expected one of "
                             f"{', '.join(RAMP_UP_STRATEGIES)}", parameters=("ramp_up_strategy",))
        for name in ("start_rps", "end_rps"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value) or value <= 0:
                raise KvlabError(f"ramp_up_{name} {value!r}: expected requests/s > 0 "
                                 "(every request is sent at its rate)",
                                 parameters=(f"ramp_up_{name}",))
        if self.start_rps > self.end_rps:
            raise KvlabError(f"ramp_up_start_rps {self.start_rps:g} is above ramp_up_end_rps "
                             f"{self.end_rps:g}: a ramp-up rises",
                             parameters=("ramp_up_start_rps", "ramp_up_end_rps"))

    def rates(self, num_requests: int) -> np.ndarray:
        """The rate at which each request is sent."""
        progress = np.arange(num_requests) / max(num_requests - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress


RAMP_UP_STRATEGIES = ("linear", "exponential")


def ramp_up_from(strategy: str | None, start_rps: float | None,
                 end_rps: float | None) -> RampUp | None:
    """The RampUp of a strategy and its two rates, None without a strategy; vLLM's rule: the
    strategy needs both rates, and the rates need the strategy."""
    if strategy is None:
        if start_rps is not None or end_rps is not None:
            raise KvlabError("ramp_up_start_rps/ramp_up_end_rps need ramp_up_strategy",
                             parameters=("ramp_up_start_rps", "ramp_up_end_rps",
                                         "ramp_up_strategy"))
        return None
    if start_rps is None or end_rps is None:
        raise KvlabError(f"ramp_up_strategy {strategy} needs ramp_up_start_rps and "
                         "ramp_up_end_rps",
                         parameters=("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps"))
    return RampUp(strategy, start_rps, end_rps)


def ramp_arrivals(num_requests: int, ramp_up: RampUp, *, burstiness: float = 1.0,
                  seed: int = 0) -> np.ndarray:
    """Seeded arrival times under a ramp-up, first at 0: the gap before request i is
    gamma-distributed with mean 1 / (request i's rate)."""
    if num_requests == 0:
        return np.zeros(0)
    rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
    rates = ramp_up.rates(num_requests)[1:]
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
    return np.concatenate(([0.0], np.cumsum(gaps)))


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
    ramp_up: RampUp | None = None,
) -> Trace:
    """The trace with arrivals resampled at request_rate (inf: all at 0) or under a ramp-up,
    or its timestamps divided by time_scale (neither given).

    With the defaults the trace is returned unchanged. Request order and ids never change.
    """
    check_arrival_options(request_rate, burstiness, time_scale)
    if ramp_up is not None and (request_rate is not None or time_scale != 1.0):
        raise KvlabError("a ramp-up sets the rate itself: give no request_rate or time_scale "
                         "with ramp_up_strategy",
                         parameters=("ramp_up_strategy", "request_rate", "time_scale"))
    if request_rate is None and time_scale == 1.0 and ramp_up is None:
        return trace
    metadata = dict(trace.metadata)
    if ramp_up is not None:
        arrivals = ramp_arrivals(len(trace.requests), ramp_up, burstiness=burstiness,
                                 seed=seed)
        metadata.update(ramp_up_strategy=ramp_up.strategy,
                        ramp_up_start_rps=ramp_up.start_rps, ramp_up_end_rps=ramp_up.end_rps,
                        burstiness=burstiness, seed=seed)
    elif request_rate is not None:
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
