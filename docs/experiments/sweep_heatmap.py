"""A heatmap of one metric of a `kvlab sweep` over two swept settings, as a Plotly HTML page
(the figure the dashboard's Sweep page draws for a sweep folder).

    python docs/experiments/sweep_heatmap.py SWEEP.parquet OUT.html --x KEY --y KEY --metric KEY
"""

from __future__ import annotations

import argparse
import sys

from kvlab.dashboard.figures import heatmap_figure
from kvlab.dashboard.runs import load_sweep_folder
from kvlab.errors import KvlabError


def main(argv: list[str] | None = None) -> int:
    """Read the sweep, draw the heatmap, write it; 2 on a user error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="the --output folder of kvlab sweep")
    parser.add_argument("out", help="the HTML file to write")
    parser.add_argument("--x", required=True, help="a swept setting (columns)")
    parser.add_argument("--y", default=None, help="another swept setting (rows)")
    parser.add_argument("--metric", default="request_goodput", help="a summary key")
    args = parser.parse_args(argv)
    try:
        frame, axes = load_sweep_folder(args.sweep)
        for name in filter(None, (args.x, args.y)):
            if name not in axes:
                raise KvlabError(f"--x/--y {name!r}: not a swept setting; swept: "
                                 + ", ".join(axes))
        if args.metric not in frame:
            raise KvlabError(f"--metric {args.metric!r}: not a summary key of the rows")
    except KvlabError as error:
        print(f"sweep_heatmap: error: {error}", file=sys.stderr)
        return 2
    rows = frame[frame["error"].isna()] if "error" in frame else frame
    heatmap_figure(rows, args.x, args.y, args.metric).write_html(args.out,
                                                                include_plotlyjs="cdn")
    print(f"wrote {args.out} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
