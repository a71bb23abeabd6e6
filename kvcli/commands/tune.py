"""`kvlab tune`: for each candidate configuration (the points of a grid, as `kvlab sweep`'s),
the highest request rate at which enough requests meet every SLO, by bisection on the rate
with the simulator; prints the candidates ranked and saves the table and every probe."""

from __future__ import annotations

import argparse
from typing import Any

from kvlab.cli.commands.common import show_progress
from kvlab.cli.commands.sweep import (
    add_spec_arguments,
    executor_from_args,
    output_folder,
    sweep_spec,
)

SHOWN = ("max_request_rate", "capped", "slo_attainment", "request_goodput",
         "output_throughput", "p99_ttft_ms", "p99_tpot_ms", "num_probes", "status")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab tune`."""
    from kvlab.sweep import DEFAULT_MIN_ATTAINMENT, SearchOptions

    slo = parser.add_argument_group("service-level objectives and the rate search")
    slo.add_argument("--slo", action="append", default=None, metavar="KEY:MS", required=True,
                     help="a latency SLO a good request meets, KEY one of ttft, tpot, e2el, in "
                     "ms (vLLM's goodput); repeat for more, e.g. --slo ttft:2000 --slo tpot:100")
    slo.add_argument("--slo-class", default=None, metavar="NAME",
                     help="count only the requests of this SLO class (a workload spec's class or "
                     "a trace's slo_class): rank the candidates by that class's goodput "
                     "(default: all requests)")
    slo.add_argument("--min-attainment", type=float, default=100 * DEFAULT_MIN_ATTAINMENT,
                     metavar="PERCENT",
                     help="a rate is met when at least this share of all requests is good "
                     f"(default {100 * DEFAULT_MIN_ATTAINMENT:g})")
    defaults = SearchOptions()
    slo.add_argument("--start-rate", type=float, default=defaults.start_rate,
                     help=f"first request rate tried, requests/s (default {defaults.start_rate:g})")
    slo.add_argument("--min-rate", type=float, default=defaults.min_rate,
                     help=f"lowest rate tried before giving up (default {defaults.min_rate:g})")
    slo.add_argument("--max-rate", type=float, default=defaults.max_rate,
                     help=f"highest rate tried (default {defaults.max_rate:g})")
    slo.add_argument("--rate-tolerance", type=float, default=defaults.rate_tolerance,
                     help="stop when the lowest failed rate is within this share of the "
                     f"highest met one (default {defaults.rate_tolerance:g})")
    quality = parser.add_argument_group(
        "quality budget (a KV precision's cost, measured by kvlab accuracy)")
    quality.add_argument("--quality", default=None, metavar="ACCURACY.json",
                         help="what each candidate's kv_cache_dtype and precision= policy "
                         "cost the model: the output of kvlab accuracy MODEL --json "
                         "(--kv-cache-dtype ... --precision ...); shown beside each candidate")
    quality.add_argument("--max-kl", type=float, default=None, metavar="NATS",
                         help="rank only candidates whose mean logit KL is at most this; the "
                         "others are listed last, not simulated (needs --quality)")
    quality.add_argument("--max-perplexity-increase", type=float, default=None, metavar="X",
                         help="... whose perplexity rises at most this (needs --quality)")
    quality.add_argument("--min-top1", type=float, default=None, metavar="PERCENT",
                         help="... whose top-1 agreement is at least this (needs --quality)")
    add_spec_arguments(parser, what="candidate")
    parser.add_argument("-o", "--output", default=None, metavar="DIR",
                        help="folder of the ranked table (tune.parquet, tune.csv, tune.json) "
                        "and every probe (probes/, a Parquet dataset a re-run reuses; "
                        "default: the sweep file's name with .tune, or tune)")


def run(args: argparse.Namespace) -> int:
    """Tune, print the ranked table and save it."""
    from kvlab.cli.report import format_table
    from kvlab.errors import KvlabError
    from kvlab.metrics import parse_goodput
    from kvlab.sweep import SearchOptions, SweepStore, save_table, tune

    slos: dict[str, float] = {}
    for item in args.slo:
        try:
            slos.update(parse_goodput([item]))
        except KvlabError:
            raise KvlabError(f"--slo {item!r}: expected KEY:MILLISECONDS with KEY one of "
                             "ttft, tpot, e2el, e.g. --slo ttft:2000") from None
    options = SearchOptions(args.start_rate, args.rate_tolerance, args.min_rate, args.max_rate)
    options.search()  # bad bounds fail before any run
    spec = sweep_spec(args)
    if "goodput" in spec.base:
        raise KvlabError("--goodput: tune's SLOs are --slo (they set the goodput)")
    candidates = spec.points()
    quality = quality_of(args, candidates)
    folder = output_folder(args, ".tune", default="tune")
    store = SweepStore(folder / "probes")
    executor = executor_from_args(args)
    try:
        table = tune(candidates, slos, executor, store=store,
                     min_attainment=args.min_attainment / 100, options=options,
                     force=args.force, progress=show_progress(args),
                     slo_class=args.slo_class, **quality)
    finally:
        executor.close()
    slo_text = ", ".join(f"{name} <= {ms:g} ms" for name, ms in slos.items())
    whose = f"{args.slo_class} requests" if args.slo_class else "requests"
    print(f"Highest request rate with >= {args.min_attainment:g}% of {whose} meeting "
          f"{slo_text}:")
    if args.quality:
        print(f"Quality of each KV precision: {args.quality} (kvlab accuracy on its model, "
              "not necessarily the candidates')")
    params = [column for column in table.columns if column.startswith("param.")]
    rows: list[dict[str, Any]] = [
        {**row, **{column[len("param."):]: row[column] for column in params}}
        for row in table.astype(object).where(table.notna(), None).to_dict("records")]
    from kvlab.sweep.quality import QUALITY_COLUMNS

    shown_quality = list(QUALITY_COLUMNS) if args.quality else []
    columns = ["rank", *(column[len("param."):] for column in params), *shown_quality, *SHOWN]
    for row in rows if args.quality else []:  # KL in nats is small: scientific
        if row.get("kl_mean") is not None:
            row["kl_mean"] = f"{row['kl_mean']:.2e}"
    print(format_table(rows, columns))
    errors = [row for row in rows if row.get("error")]
    for row in errors[:3]:
        print(f"rank {row['rank']}: error: {row['error']}")
    paths = save_table(table, folder)
    print("Saved " + ", ".join(str(path) for path in paths) + f"; probes in {store.path}")
    return 0


def quality_of(args: argparse.Namespace, candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """tune's `notes` and `excluded` from --quality and the budget flags (empty without
    --quality); a one-line KvlabError for a budget without a file or a candidate it lacks."""
    from kvlab.errors import KvlabError
    from kvlab.sweep.quality import QualityBudget, QualityTable, judge

    min_top1 = None if args.min_top1 is None else args.min_top1 / 100
    budget = QualityBudget(args.max_kl, args.max_perplexity_increase, min_top1)
    if not args.quality:
        if budget.is_set:
            raise KvlabError("--max-kl, --max-perplexity-increase and --min-top1 need "
                             "--quality ACCURACY.json (kvlab accuracy MODEL --json)",
                             parameters=("quality",))
        return {}
    notes, excluded = judge(candidates, QualityTable.load(args.quality), budget)
    return {"notes": notes, "excluded": excluded}
