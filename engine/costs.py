"""Swap versus recompute on this device: a linear model measured once at startup.

`preemption=auto` asks it whether a victim's pages are cheaper to move to host memory and back
than to recompute. Measured, not assumed: on a CPU "host memory" is the same RAM, on a GPU it
is across PCIe, and the answer differs by orders of magnitude.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kvlab.engine.model_runner import ModelRunner

NUM_REPEATS = 3
MAX_SWAP_PAGES = 64
MAX_PREFILL_TOKENS = 256


@dataclass(slots=True, frozen=True)
class MeasuredPreemptionCosts:
    """Swap time = transfers x `swap_transfer_s` + pages x `swap_page_s` (one way, all layers);
    recompute time = tokens x `recompute_token_s` (a prefill). Satisfies PreemptionCosts."""

    swap_transfer_s: float
    swap_page_s: float
    recompute_token_s: float

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        """Seconds to move `num_pages` pages in `num_transfers` runs, one way."""
        return num_transfers * self.swap_transfer_s + num_pages * self.swap_page_s

    def recompute_time_s(self, num_tokens: int) -> float:
        """Seconds to prefill `num_tokens` tokens again."""
        return num_tokens * self.recompute_token_s

    def to_json(self) -> dict[str, float]:
        """The three coefficients, for the run's metadata (lockstep validation reuses them)."""
        return asdict(self)


def _median_time_s(work: Callable[[], Any], synchronize: Callable[[], None]) -> float:
    work()  # warm-up: first calls pay allocation and dispatch set-up
    times = []
    for _ in range(NUM_REPEATS):
        synchronize()
        start = time.perf_counter()
        work()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_preemption_costs(runner: ModelRunner, max_model_len: int) -> MeasuredPreemptionCosts:
    """Time page swaps and a prefill on the runner's device, before any request runs.

    Uses the cache's own pages as scratch (they hold nothing yet). Without host pages no swap
    can happen, and the swap cost is infinite.
    """
    cache, platform = runner.kv_cache, runner.platform
    page_size = cache.page_size
    num_tokens = max(1, min(MAX_PREFILL_TOKENS, max_model_len, cache.num_pages * page_size))
    table = list(range(-(-num_tokens // page_size)))
    tokens = [0] * num_tokens
    prefill_s = _median_time_s(lambda: runner.forward_tokens(tokens, table), platform.synchronize)
    num_pages = min(MAX_SWAP_PAGES, cache.num_pages, cache.num_host_pages)
    if num_pages < 2:
        return MeasuredPreemptionCosts(math.inf, math.inf, prefill_s / num_tokens)

    def swap(count: int) -> Callable[[], None]:
        pairs = torch.tensor([(page, page) for page in range(count)], dtype=torch.long)

        def run() -> None:
            for layer in range(len(cache.k_caches)):
                cache.backend.swap_pages(
                    cache.k_caches[layer],
                    cache.v_caches[layer],
                    cache.host_k_caches[layer],
                    cache.host_v_caches[layer],
                    pairs,
                )

        return run

    one = _median_time_s(swap(1), platform.synchronize)
    many = _median_time_s(swap(num_pages), platform.synchronize)
    page_s = max(many - one, 0.0) / (num_pages - 1)
    return MeasuredPreemptionCosts(max(one - page_s, 0.0), page_s, prefill_s / num_tokens)
