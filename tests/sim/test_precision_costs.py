"""What a simulated step with demoted pages costs (sim/precision_costs.py)."""

from __future__ import annotations

import pytest

from kvlab.policies.outputs import SchedulerOutput
from kvlab.sim.precision_costs import precision_step_time_s


class _ContextCost:
    """A cost model whose step reads its context at a microsecond a token (and records what it
    read); a page copy takes a millisecond."""

    def __init__(self, fail: bool = False) -> None:
        self.read: list[tuple[int, int]] = []
        self.fail = fail

    def step_time_s(self, shape: SchedulerOutput) -> float:
        self.read.append((shape.num_context_tokens, shape.num_padded_context_tokens))
        if self.fail:
            raise RuntimeError("the cost model failed")
        return shape.num_context_tokens * 1e-6

    def copy_time_s(self, num_pages: int) -> float:
        return num_pages * 1e-3

    def demoted_read_time_s(self, num_saved_tokens: float) -> float:
        return 0.0

    def requantize_time_s(self, num_pages: float) -> float:
        return num_pages * 1e-3


class _Demoted:
    """A precision driver whose batch's demoted pages spare `saved` context tokens and whose
    requantizations cost `pages` pages."""

    def __init__(self, saved: float, pages: float) -> None:
        self.saved, self.pages = saved, pages

    def num_saved_context_tokens(self, requests: list) -> float:
        return self.saved

    def requantized_pages(self, requantize: list) -> float:
        return self.pages


def _step() -> SchedulerOutput:
    return SchedulerOutput(step_id=0, num_decode_tokens=4, num_context_tokens=1000,
                           num_padded_context_tokens=1200)


def test_a_step_reads_less_context_and_leaves_its_output_as_it_was():
    model, output = _ContextCost(), _step()
    seconds = precision_step_time_s(model, output, _Demoted(250, 0.0))
    assert model.read == [(750, 900)]  # a quarter of the context spared, padding alike
    assert seconds == pytest.approx(750e-6)
    assert (output.num_context_tokens, output.num_padded_context_tokens) == (1000, 1200)


def test_the_output_keeps_its_context_where_the_cost_model_fails():
    output = _step()
    with pytest.raises(RuntimeError):
        precision_step_time_s(_ContextCost(fail=True), output, _Demoted(250, 0.0))
    assert (output.num_context_tokens, output.num_padded_context_tokens) == (1000, 1200)


def test_requantizations_cost_page_copies_by_their_levels():
    output = _step()
    output.mem_ops.requantize = [(7, 0, 1), (8, 0, 2)]
    seconds = precision_step_time_s(_ContextCost(), output, _Demoted(0, 0.75))
    assert seconds == pytest.approx(1000e-6 + 0.75e-3)


def test_a_calibrated_model_charges_demoted_reads_beyond_the_context_left():
    from kvlab.sim.calibrated import CalibratedCostModel

    model = CalibratedCostModel(context_token_s=1e-6, demoted_context_token_s=3e-6)
    seconds = precision_step_time_s(model, _step(), _Demoted(250, 0.0))
    assert seconds == pytest.approx(750e-6 + 250 * 3e-6)  # the context left, the spared apart
    assert precision_step_time_s(model, _step(), _Demoted(0, 0.0)) == pytest.approx(1000e-6)
