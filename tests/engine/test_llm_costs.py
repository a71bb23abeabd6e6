"""preemption=auto measures swap and recompute costs at startup and decides with them."""

from __future__ import annotations

import math

import pytest

from kvlab.engine.config import EngineConfig
from kvlab.engine.costs import MeasuredPreemptionCosts
from kvlab.engine.engine import LLMEngine
from kvlab.engine.replay import engine_metadata
from kvlab.policies.serving import ServingConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engine(policy: str) -> LLMEngine:
    serving = ServingConfig.create(policy, num_gpu_blocks_override=16)
    return LLMEngine(EngineConfig(model="tiny-llama", serving=serving))


def test_auto_preemption_measures_finite_costs_and_records_them():
    engine = _engine("paged:block_size=4,preemption=auto")
    costs = engine.preemption_costs
    assert isinstance(costs, MeasuredPreemptionCosts)
    values = costs.to_json()
    assert all(math.isfinite(v) and v >= 0 for v in values.values())
    assert costs.recompute_token_s > 0
    assert engine_metadata(engine)["preemption_costs"] == values


def test_without_host_pages_swapping_costs_infinitely_much():
    engine = _engine("paged:block_size=4,preemption=auto,host_pages=0")
    assert engine.preemption_costs.swap_time_s(1, 1) == math.inf


def test_the_swap_cost_grows_with_pages_and_transfers():
    costs = MeasuredPreemptionCosts(swap_transfer_s=2.0, swap_page_s=0.5, recompute_token_s=0.1)
    assert costs.swap_time_s(4, 1) == 4.0 and costs.swap_time_s(4, 2) == 6.0
    assert costs.recompute_time_s(30) == pytest.approx(3.0)


def test_policies_that_never_swap_measure_nothing():
    assert _engine("paged:block_size=4,preemption=swap").preemption_costs is None
    assert _engine("paged:block_size=4").kv_cache.num_host_pages == 0
