"""`kvlab calibrate`: fit the simulator's cost model to measured steps, from either source:

kvlab run --save-result --result-filename cal.json   # writes cal.steps.csv
kvlab calibrate cal.steps.csv -o costmodel.json

kvlab bench serve --base-url URL --save-result --save-detailed --result-filename b.json
kvlab calibrate --from-bench b.json -o costmodel.json   # any server: vLLM, kvlab serve, ...

vllm bench serve ... --save-result --save-detailed --result-filename v.json
kvlab calibrate --from-bench v.json --block-size 16 --num-gpu-blocks-override N

kvlab sim --cost-model costmodel.json ...
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab calibrate` (no heavy imports here)."""
    parser.add_argument(
        "profiles",
        nargs="*",
        metavar="PROFILE",
        help="per-step profiles written by `kvlab run --save-result` (<stem>.steps.csv|parquet)",
    )
    parser.add_argument(
        "-o",
        "--output",
        default="cost_model.json",
        metavar="COSTMODEL.json",
        help="where to write the fitted cost model (for `kvlab sim --cost-model`; default "
        "cost_model.json here)",
    )
    parser.add_argument(
        "--skip-first-steps",
        type=int,
        default=1,
        metavar="N",
        help="leave out the first N steps of each profile, which pay one-off warm-up costs "
        "(default 1)",
    )
    bench = parser.add_argument_group(
        "from a benchmark of a server (instead of profiles)")
    bench.add_argument("--from-bench", nargs="+", default=None, metavar="RESULT.json",
                       help="`kvlab bench serve --save-result --save-detailed` results of one "
                       "server (several: one fit over all, steadier on a shared machine), or "
                       "vLLM's own `vllm bench serve --save-result --save-detailed` results "
                       "(then give --block-size and --num-gpu-blocks-override)")
    bench.add_argument("--model", default=None,
                       help="the served model for the simulator: preset, spec file or Hugging "
                       "Face folder (default: the server's model name, when it is one)")
    bench.add_argument("--preset", choices=("vllm", "kvlab"), default=None,
                       help="the server's scheduling conventions (default: kvlab for kvlab "
                       "serve, which exports its scheduler; vllm otherwise)")
    bench.add_argument("--block-size", type=int, default=None,
                       help="tokens per page (default: the server's cache_config_info)")
    bench.add_argument("--num-gpu-blocks-override", type=int, default=None,
                       help="usable KV pages (default: the server's, less vLLM's null block)")
    bench.add_argument("--kv-cache-dtype", default=None, metavar="DTYPE",
                       help="the server's KV cache precision, vLLM's names (default: the "
                       "cache_dtype of its cache_config_info, else auto)")
    bench.add_argument("--max-num-seqs", type=int, default=None,
                       help="the server's limit (default: exported, or the preset's: vLLM "
                       "0.32 on CPU 128)")
    bench.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="the server's per-step token budget (default: exported, or the "
                       "preset's: vLLM 0.32 on CPU 2048)")
    bench.add_argument("--scheduler-reserve-full-isl", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="whether the server admits a waiting request only when its whole "
                       "prompt fits (default: the preset's: on for vllm, as 0.32 does; off for "
                       "older vLLM or --no-scheduler-reserve-full-isl)")
    bench.add_argument("--no-refine", action="store_true",
                       help="stop after the step fit (no simulator-in-the-loop search)")


def run(args: argparse.Namespace) -> int:
    """Fit, print the coefficients and fit quality, write the model."""
    from kvlab.errors import KvlabError

    if args.skip_first_steps < 0:
        raise KvlabError(f"--skip-first-steps {args.skip_first_steps}: expected 0 or more")
    if args.from_bench is not None:
        if args.profiles:
            raise KvlabError("give step profiles or --from-bench, not both")
        return _from_bench(args)
    if not args.profiles:
        raise KvlabError("give step profiles (kvlab run's <stem>.steps.csv) or --from-bench "
                         "RESULT.json")
    import dataclasses
    import sys

    from kvlab.fidelity import fit_cost_model, format_fit, load_profiles
    from kvlab.fidelity.calibration import fit_warnings

    profile = load_profiles(args.profiles)
    model = fit_cost_model(
        profile, sources=list(args.profiles), skip_first_steps=args.skip_first_steps
    )
    run_model = _profiled_model(args.profiles)
    if run_model is not None:
        model = dataclasses.replace(model, fit={**model.fit, "model": run_model})
    print(format_fit(model))
    for warning in fit_warnings(model):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"Saved {model.save(args.output)}")
    return 0


def _profiled_model(paths: list[str]) -> str | None:
    """The model the profiles' runs served, from the summary `kvlab run --save-result` wrote
    beside each (<stem>.json); None when one is missing or they disagree."""
    import json
    from pathlib import Path

    names = set()
    for path in paths:
        stem = Path(path).name.split(".steps.")[0]
        summary = Path(path).with_name(stem + ".json")
        try:
            names.add(str(json.loads(summary.read_text(encoding="utf-8")).get("model")))
        except (OSError, ValueError, AttributeError):
            return None
    return names.pop() if len(names) == 1 else None


def _from_bench(args: argparse.Namespace) -> int:
    from kvlab.bench import load_bench_result
    from kvlab.fidelity import fit_bench, format_bench_fit

    results = [load_bench_result(path) for path in args.from_bench]
    _warn_vllm_results(args.from_bench, results)
    config = bench_sim_config(results[0], args)
    fit = fit_bench(results, config, refine=not args.no_refine,
                    source=", ".join(args.from_bench))
    print(format_bench_fit(fit))
    print(f"Saved {fit.cost_model.save(args.output)}")
    return 0


def _warn_vllm_results(paths: list[str], results: list[Any]) -> None:
    """On stderr, once per file: what a `vllm bench serve` result cannot tell the fit."""
    import sys

    from kvlab.bench.vllm_result import VLLM_BENCH_LIMITS

    for path, result in zip(paths, results, strict=True):
        if VLLM_BENCH_LIMITS in result.metrics_errors:
            print(f"warning: {path}: {VLLM_BENCH_LIMITS}", file=sys.stderr)


def bench_sim_config(result: Any, args: argparse.Namespace) -> Any:
    """The SimConfig of the benchmarked server: its model (--model, else the name it serves)
    and its serving config (`server_serving`, flags overriding)."""
    from kvlab.cli.commands.common import server_overrides
    from kvlab.errors import KvlabError
    from kvlab.fidelity.from_bench import server_sim_config
    from kvlab.specs import get_model

    overrides = {
        "block_size": args.block_size,
        "kv_cache_dtype": getattr(args, "kv_cache_dtype", None),
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        **server_overrides(args),
    }
    name = args.model or result.server.model
    try:
        model = get_model(name)
    except KvlabError as exc:
        if args.model is None:
            raise KvlabError(f"the server's model {name!r} is no preset, spec file or model "
                             f"folder here: give --model ({exc})") from None
        raise
    return server_sim_config(result.server, model, preset=args.preset, overrides=overrides)
