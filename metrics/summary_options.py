"""The summary's options as vLLM's benchmark flags give them: which metrics get percentiles,
which percentiles, and the goodput SLOs; parsed and checked here."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from kvlab.errors import KvlabError

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
LATENCY_KEY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")


def percentile_label(p: float) -> str:
    """A percentile as vLLM writes it in keys: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """Parse vLLM's `--percentile-metrics ttft,tpot,itl` flag value."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    check_percentile_metrics(names)
    return names


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """Parse vLLM's `--metric-percentiles 50,90,99` flag value."""
    values = []
    for item in text.split(","):
        try:
            values.append(float(item))
        except ValueError:
            raise KvlabError(
                f"metric_percentiles: {item.strip()!r} is not a number; "
                "expected comma-separated percentiles such as 50,90,99",
                parameters=("metric_percentiles",),
            ) from None
    check_percentiles(values)
    return tuple(values)


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """Parse vLLM's `--goodput ttft:MS tpot:MS e2el:MS` flag values into SLOs in milliseconds."""
    slos: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition(":")
        try:
            slos[name.strip()] = float(value)
        except ValueError:
            raise KvlabError(
                f"goodput {item!r}: expected KEY:MILLISECONDS with KEY one of "
                f"{', '.join(GOODPUT_METRICS)}, e.g. ttft:500",
                parameters=("goodput",),
            ) from None
    check_goodput(slos)
    return slos


def check_percentile_metrics(names: Sequence[str]) -> None:
    """A KvlabError for a name that is not one of PERCENTILE_METRICS."""
    for name in names:
        if name not in PERCENTILE_METRICS:
            raise KvlabError(
                f"percentile_metrics: unknown metric {name!r}; "
                f"choose from {', '.join(PERCENTILE_METRICS)}",
                parameters=("percentile_metrics",),
            )


def check_percentiles(values: Sequence[float]) -> None:
    """A KvlabError for a percentile outside 0..100."""
    for p in values:
        if not 0.0 <= p <= 100.0:
            raise KvlabError(
                f"metric_percentiles: {p:g} is outside 0..100",
                parameters=("metric_percentiles",),
            )


def check_goodput(slos: dict[str, float]) -> None:
    """A KvlabError for an SLO that is not one of GOODPUT_METRICS or not milliseconds >= 0."""
    for name, value in slos.items():
        if name not in GOODPUT_METRICS:
            raise KvlabError(
                f"goodput: unknown SLO {name!r}; choose from {', '.join(GOODPUT_METRICS)}",
                parameters=("goodput",),
            )
        if not (math.isfinite(value) and value >= 0.0):
            raise KvlabError(
                f"goodput {name}:{value:g}: expected milliseconds >= 0",
                parameters=("goodput",),
            )
