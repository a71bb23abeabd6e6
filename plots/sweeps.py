"""The figures of a sweep: each metric against the settings swept, and a heat map of each
metric over two settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.errors import KvlabError
from kvlab.plots.load import SweepData
from kvlab.plots.model import Figure, Heat, Panel, Series

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_METRICS = ("output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                   "num_preemptions", "peak_kv_usage_perc")


def swept_keys(rows: pd.DataFrame) -> list[str]:
    """The settings a sweep varied: its `param.*` columns with more than one value, in
    column order (names without `param.`)."""
    return [str(column)[len("param."):] for column in rows.columns
            if str(column).startswith("param.") and rows[column].map(_text).nunique() > 1]


def _text(value: object) -> str:
    """A setting's value as a label: a missing one (None, NaN: the setting's default, as
    `pd=none`) is "none", a whole float its integer (16.0 -> "16")."""
    if value is None or (isinstance(value, float) and value != value):
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _ordered(values: pd.Series) -> list[str]:
    """A setting's distinct values as labels, in order: numerically when all are numbers, else
    in the order the rows first have them (a sweep's grid order: `none,host:64GiB,host:1TiB`)."""
    import pandas as pd

    labels = list(dict.fromkeys(_text(value) for value in values.tolist()))
    numbers = pd.to_numeric(pd.Series(labels, dtype=object), errors="coerce")
    if numbers.notna().all():
        return [label for _, label in sorted(zip(numbers.tolist(), labels, strict=True))]
    return labels


def _check(rows: pd.DataFrame, label: str, metrics: list[str], keys: list[str]) -> None:
    missing = [metric for metric in metrics if metric not in rows]
    if missing:
        raise KvlabError(f"--metric {missing[0]!r} is not a column of the sweep {label}")
    for key in keys:
        if f"param.{key}" not in rows:
            raise KvlabError(f"--keys {key!r} is not a setting the sweep {label} varied "
                             f"(it varied: {', '.join(swept_keys(rows)) or 'nothing'})")


def _mean_by(rows: pd.DataFrame, metric: str, by: list[str]) -> pd.Series:
    import pandas as pd

    values = pd.to_numeric(rows[metric], errors="coerce")
    columns = [rows[f"param.{key}"].map(_text) for key in by]
    return values.groupby(columns).mean()


def _line_panel(rows: pd.DataFrame, metric: str, key: str, group: str | None) -> Panel:
    """The metric (mean over the other settings) against `key`, a line per `group` value."""
    x = _ordered(rows[f"param.{key}"])
    groups: list[str | None] = [*_ordered(rows[f"param.{group}"])] if group else [None]
    means = _mean_by(rows, metric, [key] + ([group] if group else []))
    series = []
    for value in groups:
        name = metric if value is None else f"{group}={value}"
        # one key: a plain index of values; two: (value, group value) pairs
        y = [float(means.get(v if group is None else (v, value), float("nan"))) for v in x]
        series.append(Series(name, x, y))
    return Panel(f"{metric} vs {key}", key, metric, "line", tuple(series))


def _heat_panel(rows: pd.DataFrame, metric: str, x_key: str, y_key: str) -> Panel:
    """The metric's mean over the runs of each (x_key, y_key) pair."""
    x = _ordered(rows[f"param.{x_key}"])
    y = _ordered(rows[f"param.{y_key}"])
    means = _mean_by(rows, metric, [x_key, y_key])
    z = [[_cell(means.get((xv, yv))) for xv in x] for yv in y]
    return Panel(metric, x_key, y_key, "heatmap", heat=Heat(x, y, z))


def _cell(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if number != number else number


def sweep_figures(sweep: SweepData, metrics: list[str] | None = None,
                  keys: list[str] | None = None) -> list[Figure]:
    """`sweep`: each metric against the first key (a line per value of the second); with two
    or more keys also `sweep-heatmap`, each metric over the first two. Keys default to the
    settings varied, metrics to DEFAULT_METRICS present. Failed runs are left out."""
    rows = sweep.rows
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    keys = keys or swept_keys(rows)
    metrics = metrics or [metric for metric in DEFAULT_METRICS if metric in rows]
    _check(rows, sweep.label, metrics, keys)
    if rows.empty or not keys:
        raise KvlabError(f"the sweep {sweep.label} has no successful runs over a varied setting"
                         " to plot")
    group = keys[1] if len(keys) > 1 else None
    lines = tuple(_line_panel(rows, metric, keys[0], group) for metric in metrics)
    figures = [Figure("sweep", f"Sweep {sweep.label}: metrics vs {keys[0]}", lines, columns=2)]
    if group is not None:
        heats = tuple(_heat_panel(rows, metric, keys[0], group) for metric in metrics)
        figures.append(Figure("sweep-heatmap", f"Sweep {sweep.label}: {keys[0]} x {group}",
                              heats, columns=2))
    return figures
