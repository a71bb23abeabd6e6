"""`kvlab validate --lockstep` against a server's KV events: run the trace against the server
while recording its event stream (or read a saved run with `--from-bench`), replay it through
kvlab's manager and print the block-by-block report (kvlab.fidelity.kv_lockstep)."""

from __future__ import annotations

import argparse
import dataclasses
import uuid
from pathlib import Path
from typing import Any


def run_server_lockstep(args: argparse.Namespace, target: Any) -> int:
    """One bench run of the trace's requests against `target` (validate's ServerTarget) with
    its KV events, then the report; with --save-result the bench result and its stream are
    saved beside the report (`<stem>.bench.json`, what --from-bench reads again)."""
    from tqdm import tqdm

    from kvlab.bench import bench_serve
    from kvlab.bench.kv_event_stream import normalize_endpoint
    from kvlab.cli.commands.common import load_trace_from_args, show_progress

    endpoint = normalize_endpoint(args.kv_events)
    trace = load_trace_from_args(args)
    # (ids a scheduler's log names the run's requests by: --step-log, now or on the saved run)
    client = dataclasses.replace(target.client,
                                 request_id_prefix=f"validate-{uuid.uuid4().hex[:8]}-")
    with tqdm(total=len(trace), unit="req", desc="server run", leave=False,
              disable=not show_progress(args)) as bar:
        result = bench_serve(trace, client, card=target.card,
                             vocab_size=target.vocab_size, seed=args.seed,
                             on_finish=lambda _: bar.update(1), kv_events=endpoint,
                             reset_cache=args.reset_prefix_cache)
    path = _report_path(args)
    if path is not None:
        _save_bench(result, path)
    return _report(args, result, target.model, path, _step_log(args, result))


def run_saved_lockstep(args: argparse.Namespace) -> int:
    """validate --lockstep --from-bench RESULT: the report of a saved run."""
    from kvlab.bench import load_bench_result
    from kvlab.bench.kv_event_stream import load_stream, stream_path
    from kvlab.errors import KvlabError
    from kvlab.specs import get_model

    if not args.lockstep or args.base_url is not None:
        raise KvlabError("--from-bench: with --lockstep and without --base-url")
    result = load_bench_result(args.from_bench)
    result.kv_events = load_stream(stream_path(Path(args.from_bench)))
    try:
        model = get_model(str(result.server.model))
    except KvlabError:
        model = get_model(args.model)
    return _report(args, result, model, _report_path(args), _step_log(args, result))


def _step_log(args: argparse.Namespace, result: Any) -> Any:
    """--step-log's rows of the run (`read_schedule_log`, by the request-id prefix the run was
    sent with, which its result records); None without the flag."""
    from kvlab.errors import KvlabError
    from kvlab.fidelity.step_log import read_schedule_log

    if args.step_log is None:
        return None
    prefix = result.run.metadata.get("request_id_prefix")
    if not prefix:
        raise KvlabError(f"--step-log: {args.from_bench or 'the run'} records no request-id "
                         "prefix to find its requests in the log by (a run saved by an older "
                         "kvlab): send it again")
    return read_schedule_log(Path(args.step_log), str(prefix))


def _report(args: argparse.Namespace, result: Any, model: Any, path: Path | None,
            step_log: Any = None) -> int:
    """Replay (on vLLM's engine clock with `step_log`: `kv_lockstep`), print and save the
    report; 0 when every block change matched, else 1."""
    from kvlab.cli.commands.bench import check_stream, describe_stream
    from kvlab.cli.commands.common import server_overrides
    from kvlab.cli.commands.validate_report import save_document
    from kvlab.fidelity import server_sim_config
    from kvlab.fidelity.kv_lockstep import format_kv_lockstep, kv_lockstep

    stream = result.kv_events
    print(describe_stream(stream))
    check_stream(stream)
    config = server_sim_config(result.server, model, preset=args.server_preset,
                               overrides=server_overrides(args))
    report = kv_lockstep(result, config, step_log=step_log)
    policy = config.serving.policy.to_string()
    source = " (the server's kvlab plugin)" if result.server.eviction else ""
    print(f"{'kvlab replays policy:':<40} {policy}{source}")
    clock = "the client's view of its steps" if step_log is None else \
        f"vLLM's own steps ({len(step_log.steps)}, --step-log {args.step_log})"
    print(f"{'steps replayed:':<40} {clock}")
    print(format_kv_lockstep(report))
    if path is not None:
        document = {"reference": "server", "base_url": result.run.metadata.get("base_url"),
                    "kv_events": stream.endpoint, "preset": args.server_preset or "auto",
                    "policy": policy, "server_eviction": result.server.eviction,
                    "step_log": args.step_log,
                    "request_id_prefix": result.run.metadata.get("request_id_prefix"),
                    "num_requests": len(result.requests), "kv_lockstep": report.to_json()}
        save_document(path, document)
    return 0 if report.identical else 1


def _report_path(args: argparse.Namespace) -> Path | None:
    from kvlab.cli.commands.validate_report import report_path

    return report_path(args, "validate-kv") if args.save_result else None


def _save_bench(result: Any, report_path: Path) -> None:
    """The bench run beside the report: `<stem>.bench.json` (detailed, token ids), its tables
    and `<stem>.bench.kv_events.jsonl`."""
    from kvlab.bench.result_files import save_bench_result
    from kvlab.metrics.results import result_stem

    paths = save_bench_result(result, result.summary(), result_dir=report_path.parent,
                              result_filename=f"{result_stem(report_path)}.bench.json",
                              detailed=True)
    print("Saved " + ", ".join(str(path) for path in paths))
