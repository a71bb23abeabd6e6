"""The figure of a `kvlab sweep` over `kv_tiers`: prompt tokens served per memory level
(stacked) and the goodput, one group per tier configuration, as a Plotly HTML page (the
Tiers page of `kvlab dashboard` draws the same figure).

    python docs/experiments/tier_figure.py SWEEP.parquet OUT.html [--where KEY=VALUE ...]

`--where` keeps the rows of one value of another swept setting (e.g. kv_tier_overlap=none).
"""

from __future__ import annotations

import argparse
import sys

from kvlab.dashboard.figures import tier_figure
from kvlab.dashboard.runs import load_sweep_folder
from kvlab.errors import KvlabError


def main(argv: list[str] | None = None) -> int:
    """Read the sweep, keep the chosen rows, write the figure; 2 on a user error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="the --output folder of kvlab sweep")
    parser.add_argument("out", help="the HTML file to write")
    parser.add_argument("--where", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        frame, axes = load_sweep_folder(args.sweep)
        if "kv_tiers" not in frame:
            raise KvlabError(f"{args.sweep}: the sweep does not vary kv_tiers")
        for condition in args.where:
            key, _, value = condition.partition("=")
            if key not in frame:
                raise KvlabError(f"--where {condition}: no setting {key!r}; swept: "
                                 + ", ".join(axes))
            frame = frame[frame[key].astype(str) == value]
    except KvlabError as error:
        print(f"tier_figure: error: {error}", file=sys.stderr)
        return 2
    rows = frame[frame["error"].isna()] if "error" in frame else frame
    tier_figure(rows).write_html(args.out, include_plotlyjs="cdn")
    print(f"wrote {args.out} ({len(rows)} configurations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
