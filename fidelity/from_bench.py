"""Calibrate the simulator from a `kvlab bench serve` run against any server: fit the cost
model so that the simulator, run on the same requests with the server's configuration,
reproduces what the client measured.

Two sources of evidence, in two stages:

1. per-step durations reconstructed from the streaming timestamps (`reconstruct_profile`):
   every running request receives a token at each step's end, so the chunks that arrive
   together are one step; a step's requests, with the prompts it must have prefilled under the
   token budget (chunked prefill, first come first served), give its features, and the gap
   since the previous step its duration. `fit_cost_model` fits these as it fits an engine's
   measured profile.
2. the per-request latency distributions: the simulator runs the benchmark's requests (their
   actual send times and output lengths) and a Nelder-Mead search scales the step, prefill and
   decode coefficients to bring its TTFT, TPOT, ITL and E2EL (means and medians) and its
   duration to the client's (`refine`).

The server's API latency (what it adds between the client and its scheduler) is measured, not
searched, where the server exports vLLM's TTFT histogram: per scrape interval, the client's
mean TTFT less the server's, fitted as a line in the requests in flight (`api_latency_fit`).
Then, as a last step, the latency inside the server that neither that difference nor the steps
show (its front end handing a request to its engine and the first token back) is added to it:
the server's mean TTFT less its queue and prefill times, less the simulated wait for the
running step, where it exports those histograms; else the median, over the calibration
requests, of the client's TTFT less the simulated one (`in_server_latency`). Both latencies
together are a request's way in at most: stage 1 is then fitted again on the steps that the
engine cannot have spent waiting for a request on that way (`reconstruct_profile`'s
`intake_s`).

What a client cannot see is left to the simulator: prefix hits shorten prefills it
reconstructs as whole, and a preempted request's recompute is not attributed (steps where a
running request is missing are left out of stage 1; stage 2 sees them through the latencies).
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from kvlab.bench.observed import histogram_mean_ms, series_increase
from kvlab.errors import KvlabError
from kvlab.fidelity.calibration import (
    MEMORY_COLUMNS,
    STEP_FEATURES,
    TIME_COLUMN,
    finite_or_none,
    fit_quality,
    predict,
    robust_step_fit,
)
from kvlab.fidelity.optimize import nelder_mead
from kvlab.fidelity.validation import relative_error
from kvlab.metrics import summarize
from kvlab.policies.serving import ServingConfig
from kvlab.policies.spec import PolicySpec, parse_policy
from kvlab.sim import SimConfig, simulate
from kvlab.sim.api_latency import (
    api_delays,
    api_latency_terms,
    in_flight_at_send,
    scheduler_arrivals,
)
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.traces import Trace, TraceRequest

if TYPE_CHECKING:
    from kvlab.bench import BenchResult, ServerInfo
    from kvlab.metrics import RunResult
    from kvlab.specs import ModelSpec

# vLLM 0.32's scheduler on a CPU OpenAI server (EngineArgs' cpu defaults), and vLLM V1's
# memory policy: LRU prefix-cache eviction (free blocks holding no prefix reused first, as
# 0.32's free_blocks prepends them), recompute preemption of the last admitted request, no
# admission watermark, a waiting request admitted only when its whole prompt fits
# (scheduler_reserve_full_isl, 0.32's default); one page is vLLM's null block (`vllm` preset).
VLLM_SCHEDULER = {"max_num_seqs": 128, "max_num_batched_tokens": 2048,
                  "enable_chunked_prefill": True, "scheduler_reserve_full_isl": True}
VLLM_POLICY = "paged:preemption=recompute,victim=last-admitted,watermark=0"
VLLM_NULL_BLOCKS = 1
# (summary key, weight) that stage 2 matches; log-ratio errors, so every metric counts alike.
MATCHED_METRICS = (("mean_ttft_ms", 1.0), ("median_ttft_ms", 0.5), ("mean_tpot_ms", 1.0),
                   ("median_tpot_ms", 0.5), ("mean_itl_ms", 0.5), ("mean_e2el_ms", 1.0),
                   ("duration", 1.0))
# Coefficient groups stage 2 scales together.
GROUPS = {
    "step": ("step_overhead_s", "seq_s"),
    "prefill": ("prefill_token_s", "attention_pair_s"),
    "decode": ("decode_token_s", "context_token_s", "padded_context_token_s",
               "first_decode_token_s"),
}
# The step terms stage 1 fits from outside a server: fewer than an engine's own profile allows
# (its features are reconstructed, its times noisier), so that collinear terms (per sequence,
# per decode token, padded context) do not trade places from one run to the next. kvlab serve
# keeps the padded decode context its torch backend reads.
BENCH_TERMS = ("step_overhead_s", "prefill_token_s", "attention_pair_s", "decode_token_s",
               "context_token_s")
BENCH_TERMS_KVLAB = (*BENCH_TERMS, "padded_context_token_s")
GAP_FRACTIONS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8)
# A chunk read up to this many median inter-chunk gaps after its step's first chunk may still
# join that step after the next step's chunks began (`_group`).
LATE_MEMBER_FRACTION = 1.5
# Chunks this many median gaps apart or less came in one read (or one burst of reads).
READ_TOGETHER_FRACTION = 0.05
LATENCY_STEP_S = 0.01  # stage 2 moves the API latency in steps of this size
# Stage 1 is fitted again at most this many times on the steps a request's way in (API plus
# in-server latency, measured on the fit before) cannot have held, until that way grows by
# less than the tolerance. Two: where the TTFT residuals measure it, the first fit's steps
# still hold part of the wait and the way in measured on them comes out short (a test's 50 ms
# delay: 36 ms in one run, 49-51 ms in others); measured on the refit, 52-54 ms.
INTAKE_PASSES = 2
INTAKE_TOLERANCE_S = 0.001
# Stage 2's loss adds, per run, this weight times the sum of the squared log-scale factors of
# the groups: the steps measured in stage 1 stay evidence. Why: free to move, stage 2 fitted
# busy calibration windows by doubling vLLM's step overhead, and every light step with it
# (window 1's TPOT +70-93% in four runs of 2026-12-02; docs/validation.md). Chosen among
# 0.02-8 on those runs: 2 kept stage 2's TTFT and halved the TPOT error.
STEP_PRIOR_WEIGHT = 2.0
# A load term of the API latency is fitted on at least this many scrape intervals, whose mean
# loads span at least this many requests in flight.
MIN_LATENCY_INTERVALS = 6
MIN_LOAD_SPREAD = 4.0
THEIL_SEN_POINTS = 1500  # points of the API-latency line at most (about 1.1M pairs)
POOR_FIT_ERROR = 0.10  # a matched metric further off than this after the fit is a warning
# A run during which the hypervisor withheld more than this share of the client host's CPU
# (steal time) is a warning: a server on that host ran slower for it (docs/validation.md)
STEAL_WARNING_PERC = 5.0
# The steal slowdowns stage 1 tries (`steal_step_fit`), and how far apart the calibration
# runs' steal shares must be for it to tell them apart.
STEAL_SLOWDOWNS = tuple(k / 4 for k in range(17))  # 0 to 4
MIN_STEAL_SPREAD = 0.03
# The knees stage 1 tries for the bent decode term (`bent_step_fit`): a step's first this many
# decodes cost more each. None below 4: there the term is the step overhead's twin (a trial
# that let it choose 2 on kvlab serve moved the overhead into it; docs/validation.md).
FIRST_DECODES = (4, 8, 16, 32)
# ... and keeps one only where it takes the steps' error this much below the line's. Measured:
# 15-30% on kvlab serve's steps (concave), 0-6% on vLLM's, where a knee chosen anyway made a
# fresh 10x run's windows worse (3 -> 2 of 4; docs/validation.md).
MIN_BENT_GAIN = 0.10
SUMMARY_OPTIONS: dict[str, Any] = {"percentile_metrics": ("ttft", "tpot", "itl", "e2el"),
                                   "metric_percentiles": (50, 99)}


@dataclass(slots=True)
class BenchFit:
    """A cost model fitted to a bench run, how well the simulator then reproduces the run
    (`errors`: matched metric -> relative error, sim vs client) and what to beware of."""

    cost_model: CalibratedCostModel
    errors: dict[str, float | None]
    stage1_errors: dict[str, float | None]
    num_steps: int
    num_steps_server: int | None
    warnings: list[str] = field(default_factory=list)
    stage1: CalibratedCostModel | None = None  # the step fit alone, before stage 2


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


def reconstruct_profile(result: BenchResult, max_num_batched_tokens: int,
                        enable_chunked_prefill: bool = True,
                        intake_s: float = 0.0) -> pd.DataFrame:
    """Stage 1's step profile: one row per reconstructed step, with the columns
    `fit_cost_model` reads (memory work none) and `regular` (False where a running request
    missed the step: preempted, or its chunk arrived late; or where the engine may have been
    idle before it; such rows are left out of the fit).

    `intake_s`: how long a request may take from its send to the server's engine. A step
    begins at the end of the one before only where the engine was busy then: a request was
    streaming its tokens, or had been sent more than `intake_s` before and was still to
    have its first token; a request sent later may still have been on its way in, the
    engine idle until it came, and the step as timed holds that wait (`fit_bench` measures
    the way in and reconstructs again)."""
    groups = group_steps(result.requests, server_step_count(result))
    rows = _Attribution(result.requests, max_num_batched_tokens, enable_chunked_prefill,
                        intake_s)
    return pd.DataFrame([rows.step(index, group) for index, group in enumerate(groups)])


def group_steps(requests: Sequence[Any], num_server_steps: int | None = None,
                fractions: Sequence[float] = GAP_FRACTIONS, *, causal: bool = False
                ) -> list[list[tuple[float, int]]]:
    """The chunk arrivals (time, request index) grouped into steps: a new step begins after
    a gap longer than a threshold, or when a request would appear twice (a step gives each
    request one chunk), or with `causal` at a request's first chunk when the step would
    have begun (the client saw the step before it end) before the request was sent; a chunk
    read late, after the next step's had begun, still joins its own step (`_group`). The
    threshold is the one of `fractions` (times the median inter-chunk gap) whose step count
    comes closest to the server's own count when it exports one (a server streams one step's
    chunks over a spread that depends on its load), else a third of the median gap."""
    events = sorted((t, i) for i, r in enumerate(requests) for t in r.chunk_times_s)
    gaps = [g for r in requests for g in r.itls_s()]
    median = float(np.median(gaps)) if gaps else 0.0
    sent = ({(r.chunk_times_s[0], i): r.arrival_s for i, r in enumerate(requests)
             if r.chunk_times_s} if causal else None)
    together_s = READ_TOGETHER_FRACTION * median
    late = _LateChunks(LATE_MEMBER_FRACTION * median, together_s, {
        (r.chunk_times_s[0], i) for i, r in enumerate(requests) if len(r.chunk_times_s) > 1
        and r.chunk_times_s[1] - r.chunk_times_s[0] <= together_s} if causal else set())
    if not num_server_steps:
        return _group(events, max(2e-4, median / 3.0), sent, late)
    candidates = [_group(events, max(2e-5, fraction * median), sent, late)
                  for fraction in fractions]
    return min(candidates, key=lambda groups: abs(len(groups) - num_server_steps))


@dataclass(slots=True, frozen=True)
class _LateChunks:
    """What may join the step before the last (`_group`): chunks up to `window_s` after its
    start; chunks up to `together_s` apart came in one read (or one burst of reads), and
    `first_read_with_second` are the first chunks that came with their request's second."""

    window_s: float = 0.0
    together_s: float = 0.0
    first_read_with_second: set[tuple[float, int]] = field(default_factory=set)


def _group(events: list[tuple[float, int]], threshold: float,
           sent: dict[tuple[float, int], float] | None,
           late: _LateChunks) -> list[list[tuple[float, int]]]:
    """Greedy grouping (`group_steps`). A chunk that arrives within `late.window_s` of the
    start of the second to last group joins that one, a late member of its step read after a
    chunk of the next step had opened a new group, where its request is in neither of the
    last two groups and the chunk is not its first; or, with `sent` (causal grouping), where
    it is its first, from a step begun after the request was sent, read together with its
    second (its token came a step before the read) or with the late members of that step.
    (A client reading 300 streams reads one step's chunks over 10-20 ms, some after the next
    step's, and after a pause of its own, each stream's backlog at once.)
    """
    groups: list[list[tuple[float, int]]] = []
    last_group: dict[int, int] = {}  # request -> the group of its latest chunk
    last = began = -math.inf  # began: when the client saw the step before this group end
    for time_s, index in events:
        current = len(groups) - 1
        if (current >= 1 and time_s - last <= threshold
                and time_s - groups[-2][0][0] <= late.window_s
                and _late_member(time_s, index, last_group.get(index), groups, late, sent)):
            groups[-2].append((time_s, index))
            last_group[index], last = current - 1, time_s
            continue
        # (a request is in the last group exactly when its latest chunk is)
        joins = bool(groups) and time_s - last <= threshold and last_group.get(index) != current
        if joins and sent is not None and sent.get((time_s, index), -math.inf) > began:
            joins = False  # its first token: from a step that began before it was sent
        if not joins:
            began = groups[-1][0][0] if groups else math.inf  # (none seen end: any)
            groups.append([])
        groups[-1].append((time_s, index))
        last_group[index], last = len(groups) - 1, time_s
    for group in groups:  # a late member joined after later chunks
        group.sort()
    return groups


def _late_member(time_s: float, index: int, previous: int | None,
                 groups: list[list[tuple[float, int]]], late: _LateChunks,
                 sent: dict[tuple[float, int], float] | None) -> bool:
    """Whether the chunk may join the second to last group (`_group`'s rules)."""
    if previous is not None:
        return previous <= len(groups) - 3
    if sent is None:  # a first chunk moves back only where it is known when it was sent
        return False
    before, latest = groups[-2], groups[-1]
    with_late_members = (before[-1][0] > latest[0][0]  # it took chunks after the last began
                         and time_s - before[-1][0] <= late.together_s)
    if not with_late_members and (time_s, index) not in late.first_read_with_second:
        return False
    began = groups[-3][0][0] if len(groups) >= 3 else math.inf  # (none seen end: any)
    return sent.get((time_s, index), -math.inf) <= began


class _Attribution:
    """Walks the steps in order, keeping each request's prefill progress and tokens."""

    def __init__(self, requests: Sequence[Any], budget: int, chunked: bool,
                 intake_s: float = 0.0) -> None:
        self.requests, self.budget, self.chunked = requests, budget, chunked
        self.intake_s = intake_s
        self.progress = [0] * len(requests)  # prompt tokens prefilled
        self.emitted = [0] * len(requests)  # output tokens received
        self.next_chunk = [0] * len(requests)
        self.last_end = -math.inf
        self.by_arrival = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)

    def step(self, index: int, group: list[tuple[float, int]]) -> dict[str, Any]:
        end = group[0][0]
        present = {i for _, i in group}
        busy = self._in_flight(self.last_end)
        start = self.last_end if busy else min(self.requests[i].arrival_s for i in present)
        row = dict.fromkeys(STEP_FEATURES, 0)
        row.update(dict.fromkeys(MEMORY_COLUMNS, 0))
        longest = 0
        decodes = [i for i in present if self.emitted[i] > 0]
        for i in decodes:
            context = self.requests[i].prompt_len + self.emitted[i]
            row["num_context_tokens"] += context
            longest = max(longest, context)
        row["num_decode_tokens"] = len(decodes)
        budget = self.budget - len(decodes)
        firsts = [i for i in self.by_arrival if i in present and self.emitted[i] == 0]
        for i in firsts:  # their prompts end in this step
            budget -= self._prefill(i, self.requests[i].prompt_len - self.progress[i], row)
        if self.chunked:
            for i in self._waiting(start, present):
                if budget <= 0:
                    break
                # A prompt whose rest fits the budget would have ended here, its first token
                # with this step's: it was not at the server yet (sent, but its API had not
                # handed it on) or had to wait, so it computed nothing. A longer one takes
                # the budget left.
                if self.requests[i].prompt_len - self.progress[i] <= budget:
                    continue
                budget -= self._prefill(i, budget, row)
        row["num_seqs"] = len(present) + sum(1 for i in self._waiting(start, present)
                                             if self.progress[i] > 0)
        row["num_padded_context_tokens"] = len(decodes) * longest
        missing = any(self.emitted[i] > 0 and i not in present
                      and self.next_chunk[i] < len(self.requests[i].chunk_times_s)
                      for i in range(len(self.requests)))
        for i in present:
            self.emitted[i] += self.requests[i].chunk_tokens[self.next_chunk[i]]
            self.next_chunk[i] += 1
        self.last_end = end
        return {**row, "step_id": index, "start_s": start, TIME_COLUMN: max(end - start, 0.0),
                "regular": not missing and busy}

    def _prefill(self, i: int, tokens: int, row: dict[str, Any]) -> int:
        if tokens <= 0:
            return 0
        done = self.progress[i]
        row["num_prefill_tokens"] += tokens
        row["num_context_tokens"] += done + tokens
        row["num_attention_pairs"] += tokens * done + tokens * (tokens + 1) // 2
        self.progress[i] += tokens
        return tokens

    def _waiting(self, start: float, present: set[int]) -> list[int]:
        """Requests at the server when the step began, prompt not yet done, FCFS."""
        return [i for i in self.by_arrival
                if self.requests[i].arrival_s <= start and i not in present
                and self.emitted[i] == 0 and self.requests[i].chunk_times_s
                and self.progress[i] < self.requests[i].prompt_len]

    def _in_flight(self, time_s: float) -> bool:
        """Some request was at the engine at `time_s` with chunks to come: streaming them,
        or sent more than `intake_s` before."""
        sent_by = time_s - self.intake_s
        return any(r.chunk_times_s and r.chunk_times_s[-1] > time_s
                   and (r.arrival_s <= sent_by or r.chunk_times_s[0] <= time_s)
                   for r in self.requests)


def fit_bench(results: BenchResult | Sequence[BenchResult], config: SimConfig, *,
              refine: bool = True, max_evaluations: int = 80,
              source: str = "bench") -> BenchFit:
    """Stage 1 then (with `refine`) stage 2, on the simulated instance `config`, over one
    bench run or several of the same server (their steps pooled in stage 1, each run
    simulated on its own in stage 2, the losses added)."""
    runs = [results] if not isinstance(results, Sequence) else list(results)
    measured = [run.summary(**SUMMARY_OPTIONS) for run in runs]
    completed = sum(m["completed"] for m in measured)
    if completed < 2:
        raise KvlabError(f"{source}: {completed} request(s) completed; calibrating needs a "
                         "run with more")
    shares = [steal_share(run) for run in runs]
    terms = BENCH_TERMS_KVLAB if server_preset(runs[0].server) == "kvlab" else BENCH_TERMS
    latency = api_latency_fit(runs, measured)

    def step_fit(intake_s: float) -> tuple[list[pd.DataFrame], pd.DataFrame,
                                           CalibratedCostModel]:
        profiles, regular = regular_steps(runs, config.serving, shares, intake_s, source)
        return profiles, regular, dataclasses.replace(
            steal_step_fit(regular, terms), api_latency_s=latency.base_s,
            api_latency_per_request_s=latency.per_request_s)

    profiles, regular, stage1 = step_fit(0.0)
    traces = [bench_trace(run) for run in runs]

    last: list[tuple[CalibratedCostModel, list[RunResult]]] = []  # the last model simulated

    def simulate_runs(model: CalibratedCostModel) -> list[RunResult]:
        # (a model is often simulated again at once: measured for the way in, then judged;
        # judged, then stage 2's starting point; without stage 2, judged, then measured)
        if last and last[0][0] == model:
            return last[0][1]
        sims = [simulate(trace, config, cost_model=model.under_steal(share))
                for trace, share in zip(traces, shares, strict=True)]
        last[:] = [(model, sims)]
        return sims

    def errors_of(model: CalibratedCostModel) -> list[dict[str, float | None]]:
        out = []
        for sim, target in zip(simulate_runs(model), measured, strict=True):
            simulated = summarize(sim, **SUMMARY_OPTIONS)
            out.append({key: relative_error(float(simulated[key]), float(target[key]))
                        for key, _ in MATCHED_METRICS})
        return out

    intake_s = 0.0
    # The way in measured: the steps the engine may have waited for it are left out, and
    # stage 1 fitted again (else they hold the wait, and the latency added at the end counts
    # it twice: 18-33% too long a TTFT, measured). Measured again on that fit: the wait the
    # steps held is then no longer taken off it (the TTFT residuals' case).
    for _ in range(INTAKE_PASSES if latency.measured else 0):
        way_in_s = latency.base_s + in_server_latency(runs, simulate_runs(stage1), stage1)[0]
        if way_in_s < intake_s + INTAKE_TOLERANCE_S:
            break
        try:
            profiles, regular, stage1 = step_fit(way_in_s)
        except KvlabError:  # too few steps left: the fit before stands
            break
        intake_s = way_in_s
    stage1_errors = _mean_errors(errors_of(stage1))
    model, errors, evaluations = stage1, stage1_errors, 0
    if refine:
        model, run_errors, evaluations = _refine(stage1, errors_of, max_evaluations,
                                                 fit_latency=not latency.measured)
        errors = _mean_errors(run_errors)
    unseen, unseen_from = 0.0, None
    if latency.measured:  # (else stage 2 searched the latency on the TTFTs already)
        unseen, unseen_from = in_server_latency(runs, simulate_runs(model), model)
        model = dataclasses.replace(model, api_latency_s=max(0.0, model.api_latency_s + unseen))
        errors = _mean_errors(errors_of(model))
    # judged on the steps as the dedicated host the coefficients describe would run them
    dedicated = regular[TIME_COLUMN] / (1.0 + model.host_steal_slowdown * regular["steal_share"])
    quality = fit_quality(model, regular.assign(**{TIME_COLUMN: dedicated}))
    steps = sum(len(p) for p in profiles)
    counted = [server_step_count(run) for run in runs]
    server_steps = None if None in counted else sum(c for c in counted if c is not None)
    model = dataclasses.replace(model, fit={
        "sources": [source], "num_runs": len(runs), "num_steps": quality.num_steps,
        "num_memory_steps": 0, "skip_first_steps": 1,
        "method": "bench: reconstructed steps, then simulator in the loop"
        if refine else "bench: reconstructed steps", "refine_evaluations": evaluations,
        "r2": finite_or_none(quality.r2), "mape_perc": finite_or_none(quality.mape_perc),
        "total_error_perc": finite_or_none(quality.total_error_perc),
        "num_reconstructed_steps": steps, "num_server_steps": server_steps,
        "host_steal_perc": [round(100.0 * share, 2) for share in shares],
        "in_server_latency_s": unseen, "in_server_latency_from": unseen_from,
        "intake_s": intake_s, "sim_errors": errors, "server": runs[0].server.to_json(),
        "model": config.model_spec.name,
    })
    warnings = [*_warnings(errors, steps, server_steps),
                *steal_warnings(runs, "calibration run", model.host_steal_slowdown)]
    return BenchFit(model, errors, stage1_errors, steps, server_steps, warnings, stage1=stage1)


def regular_steps(runs: Sequence[BenchResult], serving: ServingConfig, shares: list[float],
                  intake_s: float = 0.0, source: str = "bench"
                  ) -> tuple[list[pd.DataFrame], pd.DataFrame]:
    """Each run's reconstructed steps (`reconstruct_profile`) and the regular ones of all,
    pooled, each with its run's steal share: every run's first step is left out (it pays a
    cold start), as are the steps a running request missed or the engine may have been
    idle before."""
    profiles = [reconstruct_profile(run, serving.max_num_batched_tokens,
                                    serving.enable_chunked_prefill, intake_s) for run in runs]
    regular = pd.concat([p[p["regular"]].iloc[1:].assign(steal_share=share)
                         for p, share in zip(profiles, shares, strict=True) if len(p)])
    if len(regular) < 4:
        raise KvlabError(f"{source}: only {len(regular)} steps could be reconstructed from "
                         "the streamed timestamps (was the run streamed, with several tokens "
                         "per request?)")
    return profiles, regular


def in_server_latency(runs: Sequence[BenchResult], sims: Sequence[RunResult],
                      cost_model: CalibratedCostModel) -> tuple[float, str]:
    """Seconds of a request's TTFT that the server spends outside its engine's steps and its
    measured API latency (its front end handing a request to its engine, the first token
    back), from each run and its simulation under `cost_model`.

    Where every run has the server's queue-time and prefill-time histograms beside its TTFT
    (vLLM, kvlab serve): the mean over the runs of its TTFT less its queue and prefill times
    (`engine_intake_overhead`: those two count from when its engine takes a request in, at a
    step's boundary), less the simulation's mean wait for the step running at an arrival
    (`mean_boundary_wait`), which the simulator makes itself. Else the median, over the
    requests with a first token in both, of the client's TTFT less the simulated one
    (`median_ttft_residual`). Why the histograms first: the residual of a busy run takes in
    the simulator's queue errors (vLLM at 10x: 69 ms, where its histograms left 25-33 ms,
    the step's wait included). Returns (seconds, where they came from: "server histograms"
    or "TTFT residuals")."""
    overheads = [engine_intake_overhead(run) for run in runs]
    if not runs or None in overheads:
        return median_ttft_residual(runs, sims), "TTFT residuals"
    waits = [mean_boundary_wait(sim, cost_model) for sim in sims]
    return float(np.mean([cast("float", overhead) - wait for overhead, wait
                          in zip(overheads, waits, strict=True)])), "server histograms"


def engine_intake_overhead(run: BenchResult) -> float | None:
    """Seconds of the server's own mean TTFT outside its engine's queue and prefill: the
    wait for the running step before its engine takes a request in, and the way in and out
    (None where it exports no such histograms)."""
    means = [histogram_mean_ms(run.series, column)
             for column in ("ttft", "queue_time", "prefill_time")]
    if None in means:
        return None
    ttft, queue, prefill = cast("list[float]", means)
    return (ttft - queue - prefill) / 1000.0


def mean_boundary_wait(sim: RunResult, cost_model: CalibratedCostModel) -> float:
    """The mean over a simulation's scheduled requests of the wait from when its scheduler
    saw each (send plus API latency) to the end of the step then running (0 when none
    ran: an idle engine takes it at once)."""
    requests = sim.requests
    per_request = api_latency_terms(cost_model)[1]
    in_flight = in_flight_at_send(requests) if per_request else None
    arrivals = scheduler_arrivals([r.arrival_s for r in requests],
                                  api_delays(requests, cost_model, in_flight))
    starts, durations = sim.steps.columns["start_s"], sim.steps.columns["duration_s"]
    waits = []
    for request, arrival in zip(requests, arrivals, strict=True):
        if request.first_scheduled_s is None:
            continue
        running = bisect_left(starts, arrival) - 1  # a step starting at the arrival takes it
        waits.append(max(0.0, starts[running] + durations[running] - arrival)
                     if running >= 0 else 0.0)
    return float(np.mean(waits)) if waits else 0.0


def median_ttft_residual(runs: Sequence[BenchResult], sims: Sequence[RunResult]) -> float:
    """The median, over every request with a first token in both, of the client's TTFT less
    the simulated one (0 with none). Why the median: a busy calibration run whose queue the
    simulator gets wrong moves a mean by tens of milliseconds."""
    residuals = []
    for run, sim in zip(runs, sims, strict=True):
        simulated = {r.request_id: r.first_token_s - r.arrival_s for r in sim.requests
                     if r.first_token_s is not None}
        residuals += [ttft - simulated[r.request_id] for r in run.requests
                      if (ttft := r.ttft_s) is not None and r.request_id in simulated]
    return float(np.median(residuals)) if residuals else 0.0


def steal_share(run: BenchResult) -> float:
    """The share (0..1) of the client host's CPU that the hypervisor withheld during the run
    (steal time; 0 where the host does not tell)."""
    steal = run.host_cpu_steal_perc()
    return 0.0 if steal is None else steal / 100.0


def steal_step_fit(profile: pd.DataFrame, terms: Sequence[str]) -> CalibratedCostModel:
    """`robust_step_fit` of the steps as a dedicated host would run them: each step's time
    divided by 1 + k x its run's `steal_share`, with the slowdown k (STEAL_SLOWDOWNS) whose
    fit, slowed down again, best matches the measured steps (`step_error`), and the knee of
    the bent decode term that `bent_step_fit` finds in the steps as measured. k is the
    model's `host_steal_slowdown`; 0 where the runs' steal shares differ by less than
    MIN_STEAL_SPREAD (nothing tells k then)."""
    bent = bent_step_fit(profile, terms)
    shares = profile["steal_share"].to_numpy(dtype=np.float64)
    measured = profile[TIME_COLUMN].to_numpy(dtype=np.float64)
    if not (measured > 0).any() or float(np.ptp(shares)) < MIN_STEAL_SPREAD:
        return bent
    best, best_error = CalibratedCostModel(), math.inf
    for slowdown in STEAL_SLOWDOWNS:
        factor = 1.0 + slowdown * shares
        model = robust_step_fit(profile.assign(**{TIME_COLUMN: measured / factor}), terms,
                                first_decodes=bent.first_decodes)
        error = step_error(predict(model, profile) * factor, measured)
        if error < best_error:
            best, best_error = dataclasses.replace(model, host_steal_slowdown=slowdown), error
    return best


def bent_step_fit(profile: pd.DataFrame, terms: Sequence[str]) -> CalibratedCostModel:
    """`robust_step_fit` on `terms`, with the bent decode term at the knee of FIRST_DECODES
    whose steps are nearest the measured ones (`step_error`) where that error is at least
    MIN_BENT_GAIN below the line's; else the line. Why: a CPU server's steps can grow faster
    over their first decodes than after (kvlab serve's own steps: a line made steps of 1-2
    decodes 51-70% too long and those of 16-64 up to 11% too short), and a line fitted to
    them puts light windows' TPOT high and busy ones' low."""
    measured = profile[TIME_COLUMN].to_numpy(dtype=np.float64)
    line = robust_step_fit(profile, terms)
    best, best_error = line, step_error(predict(line, profile), measured)
    threshold = (1.0 - MIN_BENT_GAIN) * best_error
    for first_decodes in FIRST_DECODES:
        model = robust_step_fit(profile, terms, first_decodes=first_decodes)
        error = step_error(predict(model, profile), measured)
        if error <= threshold and error < best_error:
            best, best_error = model, error
    return best


def step_error(predicted: np.ndarray, measured: np.ndarray) -> float:
    """The mean relative error of predicted step times, each step's capped at 100% (steps
    measured as 0 s left out; inf where none is left)."""
    positive = measured > 0
    if not positive.any():
        return math.inf
    relative = np.abs(predicted - measured)[positive] / measured[positive]
    return float(np.mean(np.minimum(relative, 1.0)))


def _mean_errors(per_run: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each matched metric's error averaged over the runs (None where none has one)."""
    out: dict[str, float | None] = {}
    for key, _ in MATCHED_METRICS:
        values = [v for e in per_run if (v := e.get(key)) is not None]
        out[key] = float(np.mean(values)) if values else None
    return out


@dataclass(slots=True, frozen=True)
class ApiLatency:
    """A server's API latency as fitted: seconds per request, seconds more per request in
    flight at its send, and whether the server's own TTFT measured them (its histogram)."""

    base_s: float
    per_request_s: float
    measured: bool


def api_latency_fit(runs: Sequence[BenchResult], measured: Sequence[dict[str, Any]]
                    ) -> ApiLatency:
    """The server's API latency: a Theil-Sen line in the requests in flight through the
    scrape intervals of every run (`latency_by_load`), where they show a rising load term;
    else the constant alone, the runs' mean of `api_latency` (too few intervals, loads all
    alike, or no rise). Not measured where no run has the server's TTFT histogram (then 0,
    for stage 2 to fit). Why Theil-Sen (the median of the pairwise slopes): an interval
    holding a few requests is noisy, and against kvlab serve such outliers lifted a
    least-squares line's intercept to twice the latency seen with two requests in flight."""
    constant = float(np.mean([api_latency(run, m) for run, m in zip(runs, measured,
                                                                     strict=True)]))
    was_measured = any(series_increase(run.series, "ttft_count_total") for run in runs)
    points = np.array([point for run in runs for point in latency_by_load(run)])
    if len(points) < MIN_LATENCY_INTERVALS or np.ptp(points[:, 0]) < MIN_LOAD_SPREAD:
        return ApiLatency(constant, 0.0, was_measured)
    base, per_request = theil_sen(points[:, 0], points[:, 1])
    if not per_request > 0:
        return ApiLatency(constant, 0.0, was_measured)
    return ApiLatency(max(0.0, base), per_request, True)


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line through the points: the median slope over
    the pairs with distinct x, then the median intercept under it. Over at most
    THEIL_SEN_POINTS points, evenly spaced in the given order (the pairs grow as their
    square)."""
    if len(x) > THEIL_SEN_POINTS:
        keep = np.linspace(0, len(x) - 1, THEIL_SEN_POINTS).round().astype(int)
        x, y = x[keep], y[keep]
    first, second = np.triu_indices(len(x), k=1)
    dx = x[second] - x[first]
    distinct = dx != 0
    slope = float(np.median((y[second] - y[first])[distinct] / dx[distinct]))
    return float(np.median(y - slope * x)), slope


def latency_by_load(result: BenchResult) -> list[tuple[float, float, int]]:
    """(mean requests in flight at the sends, mean API latency in seconds, requests) of each
    interval between two scrapes of a run in which the server counted as many first tokens
    as the client received: the client's mean TTFT there less the server's own (its TTFT
    histogram's increase). Empty where the server exports no TTFT histogram."""
    series = result.series
    times, sums, counts = (series.get(key) for key in ("time_s", "ttft_sum_total",
                                                       "ttft_count_total"))
    if not times or not sums or not counts:
        return []
    sent = [r for r in result.requests if r.arrival_s == r.arrival_s]  # (nan: never sent)
    load = in_flight_at_send(sent)
    firsts = sorted((r.arrival_s + r.ttft_s, r.ttft_s, load[r.request_id])
                    for r in sent if r.ttft_s is not None)
    first_times = [first for first, _, _ in firsts]
    points = []
    for index in range(len(times) - 1):
        count = counts[index + 1] - counts[index]
        total = sums[index + 1] - sums[index]
        if not count > 0 or not math.isfinite(total):
            continue
        inside = firsts[bisect_right(first_times, times[index]):
                        bisect_right(first_times, times[index + 1])]
        if len(inside) != count:  # a first token on the other side of a scrape
            continue
        client = float(np.mean([ttft for _, ttft, _ in inside]))
        points.append((float(np.mean([n for _, _, n in inside])), client - total / count,
                       len(inside)))
    return points


def api_latency(result: BenchResult, measured: dict[str, Any]) -> float:
    """What the server's API adds to a request's latency: the client's mean TTFT less the
    server's own (its TTFT histogram over the run); 0 when the server exports none."""
    server_ms = histogram_mean_ms(result.series, "ttft")
    if server_ms is None:
        return 0.0
    return max(0.0, (measured["mean_ttft_ms"] - server_ms) / 1000.0)


def _refine(start: CalibratedCostModel, errors_of: Any, max_evaluations: int, *,
            fit_latency: bool) -> tuple[CalibratedCostModel, list[dict[str, float | None]], int]:
    """Stage 2: log-scale factors on GROUPS and, with `fit_latency`, an additive change of the
    API latency (in units of LATENCY_STEP_S), Nelder-Mead on the weighted squared log-ratio of
    the matched metrics plus a pull towards stage 1 (STEP_PRIOR_WEIGHT). Why not always the
    latency: where the server measured it, moving it to fit busy runs' TTFT (a step model's
    error) put light runs' TTFT 15-30% high."""
    groups = [names for names in GROUPS.values()
              if any(getattr(start, name) > 0 for name in names)]
    cache: dict[tuple[float, ...], tuple[float, list[dict[str, float | None]]]] = {}

    def scaled(x: np.ndarray) -> CalibratedCostModel:
        changes: dict[str, Any] = {
            name: getattr(start, name) * math.exp(float(factor))
            for names, factor in zip(groups, x[:len(groups)], strict=True) for name in names}
        if fit_latency:
            changes["api_latency_s"] = max(0.0, start.api_latency_s
                                           + LATENCY_STEP_S * float(x[-1]))
        return dataclasses.replace(start, **changes)

    def loss(x: np.ndarray) -> float:
        key = tuple(np.round(x, 6))
        if key not in cache:
            errors = errors_of(scaled(x))
            prior = STEP_PRIOR_WEIGHT * len(errors) * float(np.sum(x[:len(groups)] ** 2))
            cache[key] = (sum(_loss(e) for e in errors) + prior, errors)
        return cache[key][0]

    best = nelder_mead(loss, np.zeros(len(groups) + fit_latency), step=0.3,
                       max_evaluations=max_evaluations)
    return scaled(best.x), cache[tuple(np.round(best.x, 6))][1], best.num_evaluations


def _loss(errors: dict[str, float | None]) -> float:
    total = 0.0
    for key, weight in MATCHED_METRICS:
        error = errors.get(key)
        if error is not None:
            total += weight * math.log(max(1.0 + error, 1e-3)) ** 2
    return total


def server_step_count(result: BenchResult) -> int | None:
    """Engine steps the server counted during the run (vLLM's iteration-tokens histogram)."""
    steps = series_increase(result.series, "num_steps_total")
    return None if steps is None else int(steps)


def _warnings(errors: dict[str, float | None], num_steps: int,
              server_steps: int | None) -> list[str]:
    out = []
    for key, error in errors.items():
        if error is not None and abs(error) > POOR_FIT_ERROR:
            out.append(f"poor fit: the simulator's {key} is {100 * error:+.1f}% off the "
                       "client's measurement")
    if server_steps and abs(num_steps - server_steps) > 0.2 * server_steps:
        out.append(f"the streamed timestamps gave {num_steps} steps where the server counted "
                   f"{server_steps}: chunks of one step arrived apart (a loaded client?)")
    return out


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


def format_bench_fit(fit: BenchFit) -> str:
    """The coefficients, the step fit, the simulator's error on each matched metric before
    and after stage 2, and the warnings, as `kvlab calibrate --from-bench` prints them."""
    from kvlab.fidelity.calibration import format_fit

    lines = [format_fit(fit.cost_model)]
    server = "n/a" if fit.num_steps_server is None else str(fit.num_steps_server)
    lines.append(f"{'Steps reconstructed (server counted):':<40}{fit.num_steps} ({server})")
    lines.append(f"{'Simulator vs client':<28}{'step fit':>12}{'final':>12}")
    for key, _ in MATCHED_METRICS:
        before, after = fit.stage1_errors.get(key), fit.errors.get(key)
        lines.append(f"  {key:<26}{_percent(before):>12}{_percent(after):>12}")
    lines.extend(f"warning: {text}" for text in fit.warnings)
    return "\n".join(lines)


def _percent(error: float | None) -> str:
    return "n/a" if error is None else f"{100.0 * error:+.1f}%"
