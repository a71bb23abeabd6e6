"""The figures of a `kvlab sweep` over `scheduling_policy`: the prefix hit rate of each order,
and, for a workload with SLO classes, each class's share of requests within its SLOs and Jain's
fairness over the classes; one group of bars per value of a second swept setting (e.g. the KV
cache size), as a Plotly HTML page.

    python docs/experiments/scheduling_figure.py SWEEP.parquet OUT.html [--by SETTING]
"""

from __future__ import annotations

import argparse
import sys

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.dashboard.runs import load_sweep_folder
from kvlab.errors import KvlabError

CLASS_PREFIX, CLASS_SUFFIX = "classes.", ".goodput_perc"


def scheduling_figure(frame, by: str | None) -> go.Figure:
    """Bars per scheduling policy: prefix hit rate, each class's SLO attainment (when the runs
    have classes) and Jain's fairness; `by` splits them into groups (one colour per value)."""
    classes = sorted(column[len(CLASS_PREFIX):-len(CLASS_SUFFIX)] for column in frame
                     if column.startswith(CLASS_PREFIX) and column.endswith(CLASS_SUFFIX))
    panels = [("prefix_cache_hit_rate_perc", "prefix hit rate (%)")]
    panels += [(f"{CLASS_PREFIX}{name}{CLASS_SUFFIX}", f"{name}: within SLO (%)")
               for name in classes]
    if classes and "fairness_jain" in frame:
        panels.append(("fairness_jain", "Jain's fairness"))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for _, t in panels])
    groups = [(None, frame)] if by is None else list(frame.groupby(by, sort=True))
    for color, (value, rows) in enumerate(groups):
        name = "all" if value is None else f"{by}={value}"
        for column, (key, _) in enumerate(panels, start=1):
            fig.add_trace(go.Bar(x=rows["scheduling_policy"].astype(str), y=rows[key],
                                 name=name, legendgroup=name, showlegend=column == 1,
                                 marker_color=_COLORS[color % len(_COLORS)]),
                          row=1, col=column)
    fig.update_layout(barmode="group", template="plotly_white", height=420,
                      width=360 * len(panels), legend_title_text=by or "")
    return fig


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")


def main(argv: list[str] | None = None) -> int:
    """Read the sweep, write the figure; 2 on a user error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="the --output folder of kvlab sweep")
    parser.add_argument("out", help="the HTML file to write")
    parser.add_argument("--by", default=None, metavar="SETTING",
                        help="a second swept setting: one group of bars per value")
    args = parser.parse_args(argv)
    try:
        frame, axes = load_sweep_folder(args.sweep)
        if "scheduling_policy" not in frame:
            raise KvlabError(f"{args.sweep}: the sweep does not vary scheduling_policy")
        if args.by is not None and args.by not in frame:
            raise KvlabError(f"--by {args.by}: no setting {args.by!r}; swept: "
                             + ", ".join(axes))
    except KvlabError as error:
        print(f"scheduling_figure: error: {error}", file=sys.stderr)
        return 2
    rows = frame[frame["error"].isna()] if "error" in frame else frame
    scheduling_figure(rows, args.by).write_html(args.out, include_plotlyjs="cdn")
    print(f"wrote {args.out} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
