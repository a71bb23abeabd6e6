"""The server a bench run measured, as the simulator sees it: its configuration
(`server_serving`, `server_sim_config`), the run's requests as a trace (`bench_trace`), the
steps it counted and the CPU its host lost to the hypervisor (steal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvlab.bench.observed import series_increase
from kvlab.errors import KvlabError
from kvlab.policies.serving import ServingConfig
from kvlab.policies.spec import PolicySpec, parse_policy
from kvlab.sim import SimConfig
from kvlab.traces import Trace, TraceRequest

if TYPE_CHECKING:
    from kvlab.bench import BenchResult, ServerInfo
    from kvlab.specs import ModelSpec

from kvlab.fidelity.bench_tuning import (
    MIN_STEAL_SPREAD,
    STEAL_WARNING_PERC,
)

# vLLM 0.32's scheduler on a CPU OpenAI server (EngineArgs' cpu defaults), and vLLM V1's
# memory policy: LRU prefix-cache eviction (free blocks holding no prefix reused first, as
# 0.32's free_blocks prepends them), recompute preemption of the last admitted request, no
# admission watermark, a waiting request admitted only when its whole prompt fits
# (scheduler_reserve_full_isl, 0.32's default); one page is vLLM's null block (`vllm` preset).
VLLM_SCHEDULER = {"max_num_seqs": 128, "max_num_batched_tokens": 2048,
                  "enable_chunked_prefill": True, "scheduler_reserve_full_isl": True}
VLLM_POLICY = "paged:preemption=recompute,victim=last-admitted,watermark=0"
VLLM_NULL_BLOCKS = 1

def server_preset(info: ServerInfo) -> str:
    """`vllm` for a vLLM server (its model card says owned_by vllm), else `kvlab` for kvlab
    serve (which exports its scheduler), else `vllm` (the conventions kvlab assumes)."""
    return "kvlab" if info.owned_by == "kvlab" and info.scheduler else "vllm"


def server_serving(
    info: ServerInfo, *, preset: str | None = None, overrides: dict[str, Any] | None = None
) -> ServingConfig:
    """The ServingConfig that simulates the server: page size and pages from its
    cache_config_info (less vLLM's null block), its KV cache dtype (`cache_dtype`), prefix
    caching as it runs it (a vLLM with kvlab's plugin: the eviction policy it exports), its
    prefix_cache_retention_interval, the
    scheduler it exports (kvlab serve) or the preset's, then
    `overrides` (ServingConfig.create's keywords,
    e.g. from flags). A KvlabError names what the server did not tell and no flag gave."""
    preset = preset or server_preset(info)
    if preset not in ("vllm", "kvlab"):
        raise KvlabError(f"preset {preset!r}: expected vllm or kvlab", parameters=("preset",))
    options: dict[str, Any] = {}
    policy: str | PolicySpec
    if preset == "kvlab":
        policy = info.scheduler.get("policy", "paged")
        options.update(
            max_num_seqs=int(info.scheduler.get("max_num_seqs", 256)),
            max_num_batched_tokens=int(info.scheduler.get("max_num_batched_tokens", 8192)),
            enable_chunked_prefill=info.scheduler.get("enable_chunked_prefill") != "False",
            scheduler_reserve_full_isl=info.scheduler.get("scheduler_reserve_full_isl") == "True",
            scheduling_policy=info.scheduler.get("scheduling_policy", "fcfs"),
        )
        null_blocks = 0
    else:
        policy, null_blocks = VLLM_POLICY, VLLM_NULL_BLOCKS
        options.update(VLLM_SCHEDULER)
        if info.eviction is not None and info.enable_prefix_caching:  # kvlab's vLLM plugin
            policy = parse_policy(VLLM_POLICY).with_options(eviction=info.eviction)
    if info.block_size is not None:
        options["block_size"] = info.block_size
    if info.num_gpu_blocks is not None:
        options["num_gpu_blocks_override"] = info.num_gpu_blocks - null_blocks
    options["enable_prefix_caching"] = bool(info.enable_prefix_caching)
    if info.cache_dtype is not None:
        options["kv_cache_dtype"] = info.cache_dtype
    options["prefix_cache_retention_interval"] = info.prefix_cache_retention_interval
    options["max_model_len"] = info.max_model_len
    options.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for name in ("block_size", "num_gpu_blocks_override"):
        if options.get(name) is None:
            raise KvlabError(f"the server exports no {name} (vllm:cache_config_info): give "
                             f"{name}", parameters=(name,))
    return ServingConfig.create(policy, **options)


def server_sim_config(info: ServerInfo, model: str | ModelSpec, *, preset: str | None = None,
                      overrides: dict[str, Any] | None = None) -> SimConfig:
    """The simulated instance of the server: `model` (preset, spec file, HF folder or spec)
    with the server's serving config (`server_serving`). Timing comes from a calibrated cost
    model; "cpu" hardware only stands for the host link and the memory that the server's
    exported page count overrides."""
    return SimConfig(model=model, hardware="cpu",
                     serving=server_serving(info, preset=preset, overrides=overrides))


def bench_trace(result: BenchResult, *, token_ids: bool = True) -> Trace:
    """The benchmark's requests as the simulator replays them: sent when the client sent
    them, each with the output it produced (completed) or asked for (failed), sharing prompt
    blocks as the workload did. With `token_ids` (the default), a completed request of a
    result that kept its prompts (`--kv-events`) carries the prompt and output token ids the
    server saw, so that its output blocks are cached and hashed as the server's too: vLLM
    caches full output blocks, and with the trace's hash ids alone its evictions came out
    otherwise in 3 of 7 runs (docs/validation.md, "Step for step"). Without, or where the
    run kept no prompts, the prompts share blocks by the trace's hash ids."""
    prompts = result.prompt_token_ids if token_ids else None
    requests = []
    for index, (record, hash_ids) in enumerate(zip(result.requests, result.hash_ids,
                                                   strict=True)):
        if prompts and prompts[index] and record.completed and record.output_token_ids:
            requests.append(served_request(record, prompts[index], record.arrival_s))
            continue
        output = record.num_output_tokens if record.completed else record.max_tokens
        requests.append(TraceRequest(
            request_id=record.request_id, arrival_s=record.arrival_s,
            input_len=record.prompt_len, output_len=max(1, output),
            hash_ids=None if hash_ids is None else tuple(hash_ids),
            hash_block_size=result.hash_block_size,
        ))
    requests.sort(key=lambda r: r.arrival_s)
    meta = result.run.metadata
    return Trace(name=str(meta.get("dataset") or "bench"),
                 dataset_name=str(meta.get("dataset_name") or "bench"),
                 source="bench", requests=requests)


def served_request(record: Any, prompt: list[int], arrival_s: float) -> TraceRequest:
    """A request as the server ran it, arriving at `arrival_s`: its prompt and the output it
    streamed back as token ids (`record.output_token_ids`), so that its prompt and output
    blocks hash as the server's."""
    outputs = record.output_token_ids
    return TraceRequest(request_id=record.request_id, arrival_s=arrival_s,
                        input_len=len(prompt), output_len=len(outputs),
                        prompt_token_ids=tuple(prompt), output_token_ids=tuple(outputs))


def server_step_count(result: BenchResult) -> int | None:
    """Engine steps the server counted during the run (vLLM's iteration-tokens histogram)."""
    steps = series_increase(result.series, "num_steps_total")
    return None if steps is None else int(steps)


def steal_share(run: BenchResult) -> float:
    """The share (0..1) of the client host's CPU that the hypervisor withheld during the run
    (steal time; 0 where the host does not tell)."""
    steal = run.host_cpu_steal_perc()
    return 0.0 if steal is None else steal / 100.0


def steal_warnings(runs: Sequence[BenchResult], role: str, slowdown: float, *,
                   labels: Sequence[str] | None = None) -> list[str]:
    """A warning for each run (named `labels[i]`, else `role` and its number) during which the
    client host lost more than STEAL_WARNING_PERC of its CPU to the hypervisor
    (`host_cpu_steal_perc`), saying how much slower the cost model's `slowdown`
    (host_steal_slowdown) simulates it."""
    out = []
    names = labels or [f"{role} {number}" for number in range(1, len(runs) + 1)]
    for name, run in zip(names, runs, strict=True):
        steal = run.host_cpu_steal_perc()
        if steal is None or steal <= STEAL_WARNING_PERC:
            continue
        head = (f"{name}: the hypervisor withheld {steal:.1f}% of this machine's CPU "
                "(steal time), which slows a server on it")
        out.append(f"{head}; simulated {1.0 + slowdown * steal / 100.0:.2f}x slower "
                   f"(host_steal_slowdown {slowdown:g})" if slowdown else
                   f"{head}, by how much the calibration runs could not tell (their steal "
                   f"differs by less than {100 * MIN_STEAL_SPREAD:g} points)")
    return out
