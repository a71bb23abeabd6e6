"""Summary statistics of a trace (`Trace.info()`) and their aligned text table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from kvlab.traces.types import Trace


@dataclass(slots=True, frozen=True)
class LengthStats:
    """Mean, percentiles (numpy's linear interpolation) and maximum of token lengths."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: int

    @classmethod
    def of(cls, lengths: np.ndarray) -> LengthStats:
        """The statistics of a non-empty array of lengths."""
        p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
        return cls(float(lengths.mean()), float(p50), float(p90), float(p99), int(lengths.max()))


@dataclass(slots=True, frozen=True)
class TraceInfo:
    """What `kvlab traces info` shows about a trace.

    `request_rate` is requests per second over the span from the first to the last arrival
    (inf when they all arrive at once). `prefix_share` is the share of prompt blocks whose hash
    id already appeared in an earlier block: the hit rate of an unbounded prefix cache at
    `hash_block_size` granularity; None when the trace has no hash ids. `classes` maps each
    SLO class (or priority, for a trace with priorities and no classes) to its requests and
    mean input and output lengths; empty for a trace with neither.
    """

    name: str
    dataset_name: str
    source: str
    num_requests: int
    duration_s: float
    request_rate: float
    input_len: LengthStats
    output_len: LengthStats
    prefix_share: float | None = None
    hash_block_size: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    classes: dict[str, tuple[int, float, float]] = field(default_factory=dict)


def trace_info(trace: Trace) -> TraceInfo:
    """Summarise a non-empty trace."""
    requests = trace.requests
    assert requests, "loaders never return an empty trace"
    arrivals = np.fromiter((r.arrival_s for r in requests), dtype=float, count=len(requests))
    duration_s = float(arrivals.max() - arrivals.min())
    rate = len(requests) / duration_s if duration_s > 0 else float("inf")
    inputs = np.fromiter((r.input_len for r in requests), dtype=np.int64, count=len(requests))
    outputs = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=len(requests))
    share, block_size = _prefix_share(trace)
    return TraceInfo(
        name=trace.name,
        dataset_name=trace.dataset_name,
        source=trace.source,
        num_requests=len(requests),
        duration_s=duration_s,
        request_rate=rate,
        input_len=LengthStats.of(inputs),
        output_len=LengthStats.of(outputs),
        prefix_share=share,
        hash_block_size=block_size,
        metadata=dict(trace.metadata),
        classes=_classes(trace),
    )


def _classes(trace: Trace) -> dict[str, tuple[int, float, float]]:
    """Requests and mean input and output lengths per SLO class (or per priority)."""
    requests = trace.requests
    if any(r.slo_class is not None for r in requests):
        names = [r.slo_class or "(none)" for r in requests]
    elif len({r.priority for r in requests}) > 1:
        names = [f"priority {r.priority}" for r in requests]
    else:
        return {}
    groups: dict[str, list[Any]] = {}
    for name, request in zip(names, requests, strict=True):
        groups.setdefault(name, []).append(request)
    return {name: (len(members), float(np.mean([r.input_len for r in members])),
                   float(np.mean([r.output_len for r in members])))
            for name, members in sorted(groups.items())}


def _prefix_share(trace: Trace) -> tuple[float | None, int | None]:
    """Share of hashed prompt blocks that repeat an earlier block, and the block size."""
    with_ids = [r for r in trace.requests if r.hash_ids is not None]
    if not with_ids:
        return None, None
    # Chained ids never repeat inside one request, so every repeat is a cross-request hit.
    seen: set[int] = set()
    num_blocks = 0
    for request in with_ids:
        assert request.hash_ids is not None
        seen.update(request.hash_ids)
        num_blocks += len(request.hash_ids)
    share = 1.0 - len(seen) / num_blocks if num_blocks else 0.0
    return share, with_ids[0].hash_block_size


def format_info(info: TraceInfo) -> str:
    """The aligned text table `kvlab traces info` prints."""
    lines = [
        _row("Trace:", info.name),
        _row("Dataset:", info.dataset_name),
        _row("Source:", info.source),
        _row("Requests:", f"{info.num_requests:,}"),
        _row("Duration (s):", f"{info.duration_s:,.2f}"),
        _row("Mean request rate (req/s):", f"{info.request_rate:,.2f}"),
    ]
    lines += [_row(f"{_LABELS[key]}:", str(info.metadata[key])) for key in _LABELS
              if key in info.metadata]
    lines += ["", *_length_table(info)]
    if info.prefix_share is not None:
        label = f"Prefix sharing ({info.hash_block_size}-token blocks):"
        lines += ["", _row(label, f"{info.prefix_share:.1%}")]
    if info.classes:
        lines += ["", f"{'Class':<16}{'requests':>10}{'mean in':>10}{'mean out':>10}"]
        lines += [f"{name:<16}{count:>10,}{mean_in:>10,.1f}{mean_out:>10,.1f}"
                  for name, (count, mean_in, mean_out) in info.classes.items()]
    return "\n".join(lines)


# Metadata worth a line of its own, in this order.
_LABELS = {
    "num_failed_skipped": "Failed requests skipped",
    "num_skipped_entries": "Entries skipped",
    "length_source": "Token lengths from",
    "time_scale": "Time scale",
    "request_rate": "Resampled rate (req/s)",
    "burstiness": "Burstiness",
    "seed": "Seed",
}


def _row(label: str, value: str) -> str:
    # The label column of vLLM's benchmark report (40 wide, values left-aligned after it).
    return f"{label:<39} {value}"


def _length_table(info: TraceInfo) -> list[str]:
    header = f"{'Tokens':<8}" + "".join(f"{h:>10}" for h in ("mean", "p50", "p90", "p99", "max"))
    lines = [header]
    for label, stats in (("input", info.input_len), ("output", info.output_len)):
        cells = [f"{stats.mean:,.1f}", *(f"{v:,.0f}" for v in (stats.p50, stats.p90, stats.p99)),
                 f"{stats.max:,}"]
        lines.append(f"{label:<8}" + "".join(f"{c:>10}" for c in cells))
    return lines
