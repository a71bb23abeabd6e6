"""`kvlab validate`: one trace through the real engine (`kvlab run`) and the simulator
(`kvlab sim`) with the same policy, limits and seed; a table of simulator vs engine, metric by
metric, and with `--lockstep` a step-by-step check that every memory decision matched.

The flags are `kvlab run`'s. Calibration: with `--cost-model FILE` the simulator uses that
model; otherwise a separate engine run calibrates it, on the next `--num-calibration-prompts`
requests of the same trace (the same traffic, other requests, arrivals shifted to start at 0),
stepped in turn with the validated run on cpu (`--calibration-run`);
`--calibrate-on-same-run` fits the validated run's own profile instead (optimistic: the model
has seen the very steps it is judged on). `--num-windows K` validates K consecutive excerpts,
each with its own calibration run, and compares their pooled requests. Defaults make a CPU
demo of about 20 s: 8 requests of the bundled Azure conversation excerpt on tiny-llama,
calibrated on the next 24, one thread.

With `--base-url URL` the reference is a server instead (vLLM, vLLM-Ascend, kvlab serve): each
window's calibration requests, then its validated ones, are benchmarked against it as `kvlab
bench serve` does (in turn, so that a drift of the machine meets both); one cost model is
fitted on all calibration runs (`kvlab calibrate --from-bench`); the simulator runs each
validated window's requests on the server's configuration (its /metrics: block size, blocks;
`--preset vllm|kvlab` for the scheduler) and the table compares simulator and server.

With `--base-url URL --kv-events ENDPOINT --lockstep` it compares memory decisions instead, block
by block: the trace's requests are benchmarked once while the server's KV events are recorded,
kvlab's manager replays them on the server's configuration and timeline, and the report gives
the share of prefix-cache changes (blocks stored and removed) matched in order, the first
divergence and the cause of every mismatch (kvlab.fidelity.kv_lockstep).
"""

from __future__ import annotations

import argparse
from typing import Any

from kvlab.cli.commands.bench import check_client_flags
from kvlab.cli.commands.common import server_overrides
from kvlab.cli.commands.validate_report import report_path, save_document

DEFAULT_NUM_PROMPTS = 8
# --until-std-error's most rounds by default. On this project's 2-core machine six runs left
# the noisiest window's pooled means uncertain by 6-10% (docs/validation.md, "More runs per
# window"); twelve shrink that by a factor of about 1.4 (the square root of 2).
DEFAULT_MAX_ROUNDS = 12
# Calibration requests per validated request: 3 averaged the machine's drift enough for the
# throughput target in 15 of 15 runs where 1 did in 11 of 15 (docs/validation.md).
CALIBRATION_PROMPTS_PER_PROMPT = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kvlab run`'s flags, plus calibration, lockstep and thread flags."""
    from kvlab.cli.commands import run as run_command

    run_command.add_arguments(parser, preset=False)
    # CPU step times: the engine's side of the comparison must not depend on who else is running
    parser.set_defaults(num_prompts=DEFAULT_NUM_PROMPTS, step_timer="cpu")
    helps = {
        "num_prompts": f"requests of each validated window (default {DEFAULT_NUM_PROMPTS})",
        "step_timer": "how the engine's step times are measured: cpu (default here: the "
        "engine thread's CPU time, steady on a shared machine), or wall",
        "save_result": "write the validation report as JSON: every metric of both sides, the "
        "errors, each window's, the fitted cost model",
        "result_filename": "report file name (default validate-<date>.json)",
        "table_format": "unused by validate, which writes one JSON report (default csv)",
    }
    for action in parser._actions:  # run's help states run's defaults
        action.help = helps.get(action.dest, action.help)
    _add_validation_arguments(parser.add_argument_group("validation"))
    _add_server_arguments(parser.add_argument_group(
        "a server instead of kvlab's engine (vLLM, vLLM-Ascend, kvlab serve)"))


def _add_validation_arguments(group: argparse._ArgumentGroup) -> None:
    """The calibration, windows, lockstep and thread flags."""
    group.add_argument(
        "--cost-model",
        default=None,
        metavar="FILE",
        help="calibrated cost model from `kvlab calibrate` (default: calibrate "
        "on a separate run first)",
    )
    group.add_argument(
        "--num-calibration-prompts",
        type=int,
        default=None,
        metavar="N",
        help="requests of the calibration run, taken after the validated ones "
        "(default: 3 x --num-prompts)",
    )
    group.add_argument(
        "--calibrate-on-same-run",
        action="store_true",
        help="fit the cost model on the validated run's own profile "
        "(optimistic; no calibration run)",
    )
    group.add_argument(
        "--calibration-run",
        choices=("interleaved", "before"),
        default=None,
        help="step the calibration run's engine in turn with the validated one, so that both "
        "meet the same machine, or run it to the end first (default: interleaved on cpu, "
        "where both engines fit in memory; before on an accelerator)",
    )
    group.add_argument(
        "--num-windows",
        type=int,
        default=1,
        metavar="K",
        help="validate K consecutive excerpts of --num-prompts requests, each calibrated on the "
        "requests after it, and compare their pooled requests (default 1); steadier means than "
        "one window of K times the requests, whose queue only grows",
    )
    group.add_argument(
        "--lockstep",
        action="store_true",
        help="also replay the engine's measured step times in the simulator and "
        "check that every step's memory and every preemption and swap match",
    )
    group.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: steadier step times on a shared machine)",
    )


def _add_server_arguments(server: argparse._ArgumentGroup) -> None:
    """The flags of validating a server (its URL, preset, rounds, client, KV events)."""
    from kvlab.cli.commands.bench import add_client_arguments

    server.add_argument(
        "--base-url", default=None,
        help="benchmark this OpenAI-compatible server (kvlab bench serve) instead of running "
        "the engine; the simulator then runs the server's configuration (its /metrics), on "
        "its model when the name it serves is a preset or folder here, else on --model",
    )
    server.add_argument("--preset", dest="server_preset", choices=("vllm", "kvlab"), default=None,
                        help="the server's scheduling conventions (default: kvlab for kvlab "
                        "serve, vllm otherwise)")
    server.add_argument("--num-repeats", type=int, default=None, metavar="R",
                        help="send the whole sequence of windows R times (rounds) and judge "
                        "each window on its R runs pooled, reporting how far the server's own "
                        "runs of it differ (default 1; with --until-std-error the most "
                        f"rounds, default {DEFAULT_MAX_ROUNDS}); on a shared or noisy machine a "
                        "single run of a window is one draw, and the simulator predicts the "
                        "average")
    server.add_argument("--until-std-error", type=float, default=None, metavar="PERC",
                        help="repeat rounds (3 at least, --num-repeats at most) until every "
                        "window's pooled server means (output throughput, mean TTFT and TPOT) "
                        "have a relative standard error of at most PERC percent, e.g. 5: a "
                        "simulator error is then judged against a steady average, with the runs "
                        "a noisy machine needs and no more; a warning names the windows still "
                        "above it when the rounds run out")
    server.add_argument("--no-refine", action="store_true",
                        help="fit the cost model on the calibration runs' reconstructed steps "
                        "only, without the simulator-in-the-loop search (as kvlab calibrate "
                        "bench --no-refine): seconds instead of tens of seconds, the fit a "
                        "little less close")
    add_client_arguments(server)
    server.add_argument("--kv-events", default=None, metavar="ENDPOINT",
                        help="with --lockstep: the server's KV event stream (tcp://HOST:PORT "
                        "of its --kv-events-config publisher); compares kvlab's prefix-cache "
                        "changes with the server's, block by block")
    server.add_argument("--from-bench", default=None, metavar="RESULT",
                        help="with --lockstep: compare a saved `bench serve --kv-events` run "
                        "(its JSON; the stream beside it) instead of running one")
    server.add_argument("--step-log", default=None, metavar="PATH",
                        help="with --kv-events or --from-bench: the log vLLM's scheduler "
                        "writes where it runs "
                        "with kvlab's plugin and KVLAB_VLLM_STEP_LOG=PATH (PATH.<pid>, or the "
                        "file itself): kvlab replays the run on vLLM's own steps and clock "
                        "instead of the client's view of them, so every step boundary is "
                        "vLLM's, and compares its steps with vLLM's (docs/vllm_plugin.md)")
    server.add_argument("--reset-prefix-cache", action="store_true",
                        help="with --kv-events: empty the server's prefix cache before the run "
                        "(kvlab serve; vLLM with VLLM_SERVER_DEV_MODE=1), so that both sides "
                        "start empty")


def default_calibration_run(device: str) -> str:
    """Interleaved on cpu; before elsewhere, where a second engine's KV cache may not fit."""
    return "interleaved" if device == "cpu" else "before"


def _check_mode_flags(args: argparse.Namespace) -> None:
    """Raise KvlabError naming a flag that the mode of `args` does not take."""
    from kvlab.errors import KvlabError

    repeated = args.num_repeats not in (None, 1) or args.until_std_error is not None
    if repeated and (args.base_url is None or args.lockstep):
        raise KvlabError("--num-repeats, --until-std-error: only with --base-url, without "
                         "--lockstep (the engine's side is timed on its CPU clock and needs no "
                         "repeats)")
    if args.no_refine and (args.base_url is None or args.lockstep):
        raise KvlabError("--no-refine: only with --base-url, without --lockstep (the engine's "
                         "side is calibrated from its own profile)")
    if args.step_log is not None and not args.lockstep:
        raise KvlabError("--step-log: only with --lockstep (--kv-events ENDPOINT or "
                         "--from-bench RESULT)")


def run(args: argparse.Namespace) -> int:
    """Calibrate (unless given a model), run engine and simulator, print and save the table
    (against a server: `_run_server`; a saved run's KV lockstep: --from-bench)."""
    _check_mode_flags(args)
    if args.num_repeats is None:
        args.num_repeats = 1 if args.until_std_error is None else DEFAULT_MAX_ROUNDS
    if args.from_bench is not None:
        from kvlab.cli.commands.validate_kv import run_saved_lockstep

        return run_saved_lockstep(args)
    if args.base_url is not None:
        return _run_server(args)

    import torch  # the engine's side only

    from kvlab.cli.commands.common import show_progress
    from kvlab.cli.commands.run import engine_config
    from kvlab.cli.report import format_validation
    from kvlab.errors import KvlabError
    from kvlab.fidelity import validate
    from kvlab.sim.calibrated import load_cost_model

    if args.num_threads < 1:
        raise KvlabError(f"--num-threads {args.num_threads}: expected 1 or more")
    if args.replay != "fast":
        raise KvlabError("--replay realtime: validate compares on the virtual clock; use fast")
    torch.set_num_threads(args.num_threads)
    cost_model = None if args.cost_model is None else load_cost_model(args.cost_model)
    config = engine_config(args)
    separate = cost_model is None and not args.calibrate_on_same_run
    calibration_run = args.calibration_run or default_calibration_run(args.device)
    windows = _windows(args, separate)
    result = validate(
        config,
        windows,
        cost_model=cost_model,
        calibrate_on_same_run=args.calibrate_on_same_run,
        with_lockstep=args.lockstep,
        interleave_calibration=calibration_run == "interleaved",
        progress=show_progress(args),
    )
    print(format_validation(result))
    if args.save_result:
        _save(args, result)
    if result.lockstep is not None and not result.lockstep.identical:
        return 1
    return 0


def _save(args: argparse.Namespace, result: Any) -> None:
    save_document(report_path(args, "validate"), result.to_json())


def _windows(args: argparse.Namespace, separate: bool) -> list:
    """The trace's (validated, calibration) windows the flags ask for."""
    from kvlab.cli.commands.common import load_trace_from_args
    from kvlab.errors import KvlabError
    from kvlab.traces import split_windows

    num_prompts = args.num_prompts
    num_calibration = (CALIBRATION_PROMPTS_PER_PROMPT * num_prompts
                       if args.num_calibration_prompts is None else args.num_calibration_prompts)
    if separate and num_calibration < 1:
        raise KvlabError(f"--num-calibration-prompts {num_calibration}: expected 1 or more")
    if args.num_windows < 1:
        raise KvlabError(f"--num-windows {args.num_windows}: expected 1 or more")
    if not separate:
        num_calibration = 0
    args.num_prompts = (num_prompts + num_calibration) * args.num_windows
    return split_windows(load_trace_from_args(args), num_prompts, num_calibration,
                         args.num_windows)


def _run_server(args: argparse.Namespace) -> int:
    """validate --base-url: the same table, simulator against a server's benchmark."""
    from kvlab.cli.commands.common import show_progress
    from kvlab.cli.report import format_validation
    from kvlab.errors import KvlabError
    from kvlab.fidelity.server_validation import validate_server
    from kvlab.sim.calibrated import load_cost_model

    if args.lockstep:
        if args.kv_events is None:
            raise KvlabError("--lockstep with --base-url compares the server's KV events: give "
                             "--kv-events ENDPOINT")
        from kvlab.cli.commands.validate_kv import run_server_lockstep

        return run_server_lockstep(args, _server_target(args))
    if args.kv_events is not None or args.reset_prefix_cache or args.step_log is not None:
        raise KvlabError("--kv-events, --step-log and --reset-prefix-cache: only with "
                         "--lockstep")
    check_client_flags(args)
    cost_model = None if args.cost_model is None else load_cost_model(args.cost_model)
    separate = cost_model is None and not args.calibrate_on_same_run
    windows = _windows(args, separate)
    target = _server_target(args)
    total = args.num_repeats * sum(len(t) + (len(c or ()) if separate else 0)
                                   for t, c in windows)
    from tqdm import tqdm

    with tqdm(total=total, unit="req", desc="server runs", leave=False,
              disable=not show_progress(args)) as bar:
        result = validate_server(target, windows, cost_model=cost_model,
                                 calibrate_on_same_run=args.calibrate_on_same_run,
                                 num_repeats=args.num_repeats, refine=not args.no_refine,
                                 until_std_error=None if args.until_std_error is None
                                 else args.until_std_error / 100.0,
                                 on_finish=lambda _: bar.update(1))
    print(format_validation(result))
    if args.save_result:
        _save(args, result)
    return 0


def _server_target(args: argparse.Namespace) -> Any:
    """The server of --base-url, ready: its client config, model card and the model the
    simulator runs (the served name when it is a preset or folder here, else --model)."""
    import os

    from kvlab.bench import ClientConfig, resolve_model, vocab_size_of, wait_ready
    from kvlab.errors import KvlabError
    from kvlab.fidelity.server_validation import ServerTarget
    from kvlab.specs import get_model

    check_client_flags(args)
    base_url = args.base_url.rstrip("/")
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    wait_ready(base_url, 0, api_key=api_key)
    card = resolve_model(base_url, None, api_key)
    try:
        model = get_model(str(card["id"]))
    except KvlabError:
        model = get_model(args.model)
    client = ClientConfig(base_url=base_url, model=str(card["id"]), api_key=api_key,
                          max_concurrency=args.max_concurrency, ignore_eos=True,
                          scrape_interval_s=args.metrics_interval)
    return ServerTarget(client=client, card=card,
                        vocab_size=vocab_size_of(card, None, args.vocab_size), model=model,
                        preset=args.server_preset, overrides=server_overrides(args), seed=args.seed)
