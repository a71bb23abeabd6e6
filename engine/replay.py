"""A request trace through the real engine: arrivals replayed on a virtual or wall clock, and
the same `RunResult` the simulator produces (prompt ids: `kvlab.traces.synthesize_prompt_ids`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from kvlab.engine.engine import EngineRun, LLMEngine
from kvlab.engine.kv_sizing import model_dtype
from kvlab.engine.sampler import SamplingParams
from kvlab.metrics import RunResult
from kvlab.policies import Request
from kvlab.policies.precision.summary import record_precision_mix
from kvlab.policies.tiers import tier_summary

if TYPE_CHECKING:  # traces are duck-typed here: the engine does not depend on kvlab.traces
    from kvlab.traces import Trace


def with_outputs(trace: Trace, requests: list[Request]) -> Trace:
    """The trace with the output ids that the engine sampled for each request (by request
    id): the simulator then caches the output pages that the engine cached."""
    outputs = {request.request_id: tuple(request.output_token_ids) for request in requests}
    recorded = [
        dataclasses.replace(item, output_token_ids=outputs.get(item.request_id))
        for item in trace.requests
    ]
    return dataclasses.replace(trace, requests=recorded)


def run_trace(
    engine: LLMEngine, trace: Trace, *, replay: str = "fast", progress: bool = False
) -> RunResult:
    """Serve every request of a trace (with prompt ids, see `synthesize_prompt_ids`) and return
    the run's records, as `kvlab.sim.simulate` does for the simulator.

    Each request decodes greedily for exactly its trace output length (ignore_eos, max_tokens);
    requests keep their trace ids. `replay` is `fast` (virtual clock: measured step durations,
    idle gaps skipped) or `realtime` (wall clock, arrivals waited for).
    """
    run = engine.run(trace_requests(engine, trace), replay=replay, progress=progress)
    return trace_result(engine, trace, run, replay)


def trace_requests(engine: LLMEngine, trace: Trace) -> list[Request]:
    """The engine's requests for a trace with prompt ids (run_trace's first half)."""
    requests = []
    for item in trace.requests:
        if item.prompt_token_ids is None:
            raise ValueError("run_trace needs prompt token ids: call synthesize_prompt_ids")
        params = SamplingParams(temperature=0.0, max_tokens=item.output_len, ignore_eos=True)
        requests.append(
            engine.make_request(
                item.prompt_token_ids,
                params,
                arrival_s=item.arrival_s,
                hash_ids=item.hash_ids,
                hash_block_size=item.hash_block_size,
                request_id=item.request_id,
                priority=item.priority,
                slo_class=item.slo_class,
            )
        )
    return requests


def trace_result(engine: LLMEngine, trace: Trace, run: EngineRun, replay: str) -> RunResult:
    """The RunResult of an engine run of `trace` (run_trace's second half)."""
    metadata = {**engine_metadata(engine), **trace.result_metadata(), "replay": replay}
    manager = engine.manager
    if manager.tiers is not None:
        manager.check_tiers()
        prompt_tokens = sum(r.prompt_len for r in run.requests if r.first_scheduled_s is not None)
        metadata.update(tier_summary(manager.tiers, manager.tier_stats, manager.first_hit_pages,
                                     engine.page_size, prompt_tokens))
    if manager.precision is not None:  # the precision mix, as the simulator has it
        metadata.update(record_precision_mix(manager.precision, run.steps, run.duration_s))
    return RunResult(
        requests=run.requests,
        steps=run.steps,
        itls_s=run.itls_s,
        duration_s=run.duration_s,
        page_size=engine.page_size,
        num_total_pages=engine.num_pages,
        kv_cache_size_tokens=engine.num_pages * engine.page_size,
        num_host_pages=engine.manager.num_host_pages,
        metadata=metadata,
    )


def engine_metadata(engine: LLMEngine) -> dict[str, Any]:
    """The engine's configuration as saved with a result (JSON-ready)."""
    config, costs = engine.config, engine.preemption_costs
    return {
        "model": config.model,
        "hardware": engine.device_name,
        "backend": f"engine:{engine.platform.name}",
        "device": str(engine.platform.device),
        "attention_backend": config.attention_backend,
        "cpu_gemm": config.cpu_gemm,
        "dtype": str(model_dtype(engine.model)).removeprefix("torch."),
        "max_model_len": engine.max_model_len,
        "preemption_costs": costs.to_json() if hasattr(costs, "to_json") else None,
        **config.serving.result_metadata(),
    }
