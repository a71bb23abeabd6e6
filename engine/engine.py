"""The engine loop: schedule -> execute -> commit, around the policies' Scheduler and manager.

Every memory decision is the scheduler's and the KV-cache manager's, made from the same inputs
the simulator gives them; the engine only carries them out (MemOps, forward, sampling) and
measures how long each step took. That is what lets lockstep validation replay a run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from tqdm import tqdm

from kvlab.engine.cache_layout import cache_layout
from kvlab.engine.clock import VirtualClock, WallClock, make_clock
from kvlab.engine.config import EngineConfig
from kvlab.engine.costs import measure_preemption_costs
from kvlab.engine.kv_cache import KVCache
from kvlab.engine.kv_scales import layer_kv_quants
from kvlab.engine.kv_sizing import (
    determine_num_pages,
    model_dtype,
    num_swap_pages,
    num_tier_pages,
    page_bytes_all_layers,
    sizing_warnings,
    startup_lines,
)
from kvlab.engine.loader import load_model
from kvlab.engine.model_runner import ModelRunner, group_block_tables
from kvlab.engine.platform import Platform, get_platform
from kvlab.engine.precision_pages import attach as attach_precision
from kvlab.engine.precision_pages import engine_ladder, num_page_ids
from kvlab.engine.sampler import SamplingParams
from kvlab.errors import KvlabError
from kvlab.heap import frozen_heap
from kvlab.kernels import get_backend
from kvlab.kernels.backend import check_kv_cache_dtype
from kvlab.metrics import StepRecorder
from kvlab.policies import (
    KVCacheManager,
    PolicySpec,
    Request,
    Scheduler,
    SchedulerOutput,
    StepLoop,
)
from kvlab.policies.tiers import build_tiers

_SEED_MASK = (1 << 63) - 1


@dataclass(slots=True)
class EngineRun:
    """What one `LLMEngine.run` leaves: its requests (all finished), per-step records, the gaps
    between consecutive tokens, and the clock times of the first arrival and the last finish."""

    requests: list[Request]
    steps: StepRecorder
    itls_s: np.ndarray
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        """First arrival to last finish, on the run's clock."""
        return self.end_s - self.start_s


def describe_device(platform: Platform) -> str:
    """A short description of the device, for results ("cpu (2 threads)", a GPU's name)."""
    if platform.name == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    if platform.name == "cuda":
        return torch.cuda.get_device_name(platform.device)
    return str(platform.device)


class LLMEngine:
    """A paged inference engine on one device, driven step by step by the policies' Scheduler.

    Build it from an EngineConfig; `make_request` turns a prompt into a Request, and `run`
    serves a list of requests to completion on a virtual (`fast`) or wall (`realtime`) clock.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.platform = get_platform(config.device)
        self._timer = _step_timer(config.step_timer, self.platform.device.type)
        backend = get_backend(config.attention_backend)
        check_device = getattr(backend, "check_device", None)  # a backend's own device rules
        if check_device is not None:
            check_device(self.platform.device)
        serving = config.serving
        spec = serving.policy
        self.policy: PolicySpec = spec
        self.model, self.model_config, self.tokenizer = load_model(
            config.model, dtype=config.dtype, device=self.platform.device, attn_backend=backend
        )
        self.model.use_cpu_gemm(config.cpu_gemm)
        _check_sliding_window(backend, self.model_config.layer_windows, config.attention_backend)
        dtype = model_dtype(self.model)
        check_kv_cache_dtype(backend, serving.kv_cache_dtype, dtype)
        layout = cache_layout(self.model_config, config.layer_groups,
                              serving.hybrid_kv_cache_manager)
        num_cache_layers = layout.num_tensors(self.model_config.num_hidden_layers)
        self.max_model_len = serving.resolve_max_model_len(
            self.model_config.max_model_len, str(config.model)
        )
        kv_quants = layer_kv_quants(
            serving.kv_cache_dtype, self.model, self.model_config, str(config.model),
            platform=self.platform, page_size=spec.block_size, max_model_len=self.max_model_len,
            tokenizer=self.tokenizer)
        num_pages = determine_num_pages(self.model, self.platform, serving, self.max_model_len,
                                        num_cache_layers)
        # mixed-precision paging: more page ids than device pages (engine/precision_pages.py)
        ladder = engine_ladder(spec, serving.kv_cache_dtype, self.model_config, dtype)
        swap_pages = num_swap_pages(self.model_config, serving, dtype, num_cache_layers)
        tier_pages = num_tier_pages(self.model_config, serving, dtype, num_cache_layers)
        self.kv_cache = KVCache.for_model(
            self.model_config,
            num_pages=num_page_ids(ladder, num_pages),
            num_host_pages=serving.num_host_pages(num_pages, swap_pages),
            page_size=spec.block_size,
            dtype=dtype,
            platform=self.platform,
            backend=backend,
            num_tier_pages=tier_pages,
            layer_slots=layout.layer_slots,
            kv_cache_dtype=serving.kv_cache_dtype,
            kv_quants=kv_quants,
        )
        if ladder is not None:
            attach_precision(self.kv_cache, ladder, self.model)
        # the manager is built below (its costs are measured on this runner), and its block
        # tables set on the runner then
        self.runner = ModelRunner(
            self.model,
            self.kv_cache,
            self.platform,
            lambda r: [self.manager.block_table(r)],
            layer_groups=layout.layer_groups,
        )
        if config.warmup:
            # Decodes only warm dispatch: a few are enough (and cheap in Triton's interpreter).
            self.runner.warm_up(
                min(serving.max_num_batched_tokens, self.max_model_len),
                min(serving.max_num_seqs, serving.max_num_batched_tokens, 8),
            )
        costs = config.preemption_costs
        if spec.preemption == "auto" and costs is None:
            costs = measure_preemption_costs(self.runner, self.max_model_len)
        self.preemption_costs = costs
        # the host tier's pages are the cache's tier pages (none without a tier)
        self.tiers = build_tiers(serving.kv_tiers, spec.block_size, page_bytes_all_layers(
            self.model_config, spec.block_size, dtype, num_cache_layers,
            serving.kv_cache_dtype)) or None
        self.manager = KVCacheManager(
            spec,
            num_pages,
            max_model_len=self.max_model_len,
            num_host_pages=self.kv_cache.num_host_pages,
            costs=costs,
            tiers=self.tiers,
            tier_config=serving.kv_tiers,
            groups=layout.groups,
            retention_interval=serving.prefix_cache_retention_interval,
            precision_ladder=ladder,
        )
        if self.manager.precision is not None:
            self.kv_cache.precision.follow(self.manager.precision.ledger.levels)
        self.runner.block_tables = group_block_tables(self.manager)
        self.scheduler = Scheduler(serving.scheduler_config(self.max_model_len), self.manager)
        self.startup_lines = startup_lines(
            num_pages, spec.block_size, self.max_model_len, platform=self.platform.name,
            groups=layout.groups, max_num_batched_tokens=serving.max_num_batched_tokens,
            enable_prefix_caching=spec.prefix_caching) + sizing_warnings(self.platform, serving)
        self.device_name = describe_device(self.platform)
        self._params: dict[int, SamplingParams] = {}
        self._stop_ids: dict[int, frozenset[int]] = {}
        self._next_request_id = 0

    # ----------------------------------------------------------------------------- requests

    @property
    def num_pages(self) -> int:
        """Device KV pages."""
        return self.manager.num_total_pages

    @property
    def page_size(self) -> int:
        """Token slots per page (the policy's block_size)."""
        return self.manager.page_size

    def make_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        arrival_s: float = 0.0,
        hash_ids: tuple[int, ...] | None = None,
        hash_block_size: int = 512,
        request_id: int | None = None,
        priority: int = 0,
        slo_class: str | None = None,
    ) -> Request:
        """A new request; its output budget is `params.max_tokens`; `priority` orders it under
        priority scheduling (lower first), `slo_class` names the class it is reported in.

        `request_id` defaults to a fresh one; a trace passes its own ids so that ties in the
        scheduler break exactly as in the simulator. A sampling request without a seed gets one
        derived from the engine's seed and its id, so its tokens depend on neither the batch nor
        the global RNG.
        """
        ids = list(prompt_token_ids)
        self.check_prompt(ids)
        if request_id is None:
            request_id = self._next_request_id
        if request_id in self._params:
            raise KvlabError(f"request id {request_id} is already in use by an unfinished request")
        self._next_request_id = max(self._next_request_id, request_id + 1)
        if params.seed is None and not params.is_greedy:
            seed = self.config.serving.seed
            params = replace(params, seed=(seed * 1_000_003 + request_id) & _SEED_MASK)
        eos = () if params.ignore_eos else self.model_config.eos_token_ids
        self._params[request_id] = params
        self._stop_ids[request_id] = frozenset((*eos, *params.stop_token_ids))
        return Request(
            request_id=request_id,
            prompt_len=len(ids),
            max_output_tokens=params.max_tokens,
            arrival_s=arrival_s,
            prompt_token_ids=ids,
            hash_ids=hash_ids,
            hash_block_size=hash_block_size,
            output_ids_known=True,  # sampled before their KV is computed: decode pages cache
            priority=priority,
            slo_class=slo_class,
        )

    def check_prompt(self, ids: list[int]) -> None:
        """Raise a KvlabError unless `ids` is a non-empty list of ids in the vocabulary."""
        if not ids:
            raise KvlabError("a prompt is empty; every request needs at least one token")
        vocab_size = self.model_config.vocab_size
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise KvlabError(
                f"prompt token id {bad} is outside the model's vocabulary [0, {vocab_size})"
            )

    # ----------------------------------------------------------------------------- the loop

    def run(
        self, requests: Sequence[Request], *, replay: str = "fast", progress: bool = False
    ) -> EngineRun:
        """Serve `requests` (from make_request) until every one has finished or failed.

        Arrivals follow the time rule (docs/architecture.md) through the StepLoop: a step
        starting at clock time t first admits every request with arrival <= t; an idle engine
        waits for the next arrival (the virtual clock jumps, the wall clock sleeps). Tokens are
        stamped with the end of the step that produced them.
        """
        steps = self.iter_run(requests, replay=replay)
        bar = tqdm(
            total=len(requests), desc="Processed prompts", disable=None if progress else True
        )
        with bar, frozen_heap():
            while True:
                try:
                    bar.update(next(steps))
                except StopIteration as done:
                    return done.value

    def iter_run(
        self, requests: Sequence[Request], *, replay: str = "fast"
    ) -> Generator[int, None, EngineRun]:
        """`run`, one engine step per `next()`: yields the number of requests each step ended
        and returns the EngineRun. Lets a caller step two engines in turn (`kvlab validate`
        measures its calibration run alongside the validated one this way)."""
        clock = make_clock(replay)
        loop = StepLoop(self.scheduler, requests)
        first_itl = len(self.scheduler.itls_s)
        while loop.has_work():
            now_s = clock.now()
            if not loop.admit(now_s):
                next_s = loop.next_arrival_s()
                assert next_s is not None
                clock.wait_until(next_s)
                continue
            output, finished = self.step(loop, now_s, clock)
            yield len(output.failed) + len(finished)
        itls = np.frombuffer(self.scheduler.itls_s, dtype=np.float64)[first_itl:].copy()
        start = min((r.arrival_s for r in requests), default=0.0)
        end = max((r.finish_s for r in requests if r.finish_s is not None), default=start)
        return EngineRun(list(requests), loop.steps, itls, start, end)

    def step(
        self, loop: StepLoop, now_s: float, clock: VirtualClock | WallClock
    ) -> tuple[SchedulerOutput, list[Request]]:
        """One step of `loop` (on this engine's scheduler) starting at `now_s`, run on the model;
        returns the step and the requests it finished (failed ones are in `output.failed`)."""
        timer = self._timer
        started = timer()
        output = loop.schedule(now_s)
        sampled = self.runner.execute(output, self._params)
        measured_s = timer() - started
        end_s = clock.end_step(now_s, measured_s)
        finished = loop.commit(
            output,
            start_s=now_s,
            end_s=end_s,
            wall_time_s=measured_s,
            sampled_token_ids=sampled,
            stopped=self._stopped(output, sampled),
        )
        for request in (*output.failed, *finished):
            self._forget(request.request_id)
        return output, finished

    def abort(self, request: Request, now_s: float) -> None:
        """Stop a request wherever it is (waiting, running, swapped out) and free its memory."""
        if not request.is_finished:
            self.scheduler.abort(request, now_s)
        self._forget(request.request_id)

    def _stopped(self, output: SchedulerOutput, sampled: list[int | None]) -> set[int]:
        """Requests whose new token is an eos (unless ignore_eos) or one of their stop tokens."""
        stop_ids = self._stop_ids
        return {
            request.request_id
            for request, token in zip(output.requests, sampled, strict=True)
            if token is not None and token in stop_ids[request.request_id]
        }

    def _forget(self, request_id: int) -> None:
        self._params.pop(request_id, None)
        self._stop_ids.pop(request_id, None)
        self.runner.sampler.free(request_id)

def _check_sliding_window(backend: object, layer_windows: tuple[int, ...], name: str) -> None:
    """A KvlabError at start-up when the model has sliding-window layers the backend lacks."""
    if any(layer_windows) and not getattr(backend, "supports_sliding_window", False):
        raise KvlabError(
            f"the model has sliding-window layers (windows {sorted(set(layer_windows) - {0})}) "
            f"and attention_backend {name} has no sliding-window attention; use attention_backend "
            "torch or triton",
            parameters=("attention_backend",),
        )


STEP_TIMERS = ("wall", "cpu")


def _step_timer(name: str, device_type: str) -> Callable[[], float]:
    """The clock a step's duration is read from (see EngineConfig.step_timer)."""
    if name not in STEP_TIMERS:
        raise KvlabError(
            f"step_timer {name!r}: choose from {', '.join(STEP_TIMERS)}",
            parameters=("step_timer",),
        )
    if name == "wall":
        return time.perf_counter
    if device_type != "cpu":
        raise KvlabError(
            f"step_timer cpu measures host CPU time; on {device_type} the work runs on the "
            "device: use step_timer wall",
            parameters=("step_timer",),
        )
    return time.thread_time
