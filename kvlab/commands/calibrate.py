"""`kvlab calibrate`: fit the simulator's cost model to the per-step profiles of `kvlab run`.

kvlab run --save-result --result-filename cal.json   # writes cal.steps.csv
kvlab calibrate cal.steps.csv -o costmodel.json
kvlab sim --cost-model costmodel.json ...
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab calibrate` (no heavy imports here)."""
    parser.add_argument(
        "profiles",
        nargs="+",
        metavar="PROFILE",
        help="per-step profiles written by `kvlab run --save-result` (<stem>.steps.csv|parquet)",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="COSTMODEL.json",
        help="where to write the fitted cost model (for `kvlab sim --cost-model`)",
    )
    parser.add_argument(
        "--skip-first-steps",
        type=int,
        default=1,
        metavar="N",
        help="leave out the first N steps of each profile, which pay one-off warm-up costs "
        "(default 1)",
    )


def run(args: argparse.Namespace) -> int:
    """Load the profiles, fit, print the coefficients and fit quality, write the model."""
    from kvlab.errors import KvlabError
    from kvlab.fidelity import fit_cost_model, format_fit, load_profiles

    if args.skip_first_steps < 0:
        raise KvlabError(f"--skip-first-steps {args.skip_first_steps}: expected 0 or more")
    profile = load_profiles(args.profiles)
    model = fit_cost_model(
        profile, sources=list(args.profiles), skip_first_steps=args.skip_first_steps
    )
    print(format_fit(model))
    print(f"Saved {model.save(args.output)}")
    return 0
