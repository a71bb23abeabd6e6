"""The roofline cost model: sanity figures, monotonicity, swap latency, tensor parallelism; the
decode-step timers of the simulator's fast path, equal to the step time of the same shape."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.policies.outputs import MemOps, SchedulerOutput
from kvlab.sim.calibrated import CalibratedCostModel
from kvlab.sim.cost_model import CostModel, RooflineCostModel, StepShape, decode_step_timer
from kvlab.specs import get_hardware, get_model


@pytest.fixture(scope="module")
def llama_a100() -> RooflineCostModel:
    return RooflineCostModel(get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=16)


def _prefill(num_tokens: int) -> StepShape:
    return StepShape(
        num_prefill_tokens=num_tokens,
        num_context_tokens=num_tokens,
        num_seqs=1,
        num_attention_pairs=num_tokens * (num_tokens + 1) // 2,
    )


def test_roofline_model_satisfies_the_interface(llama_a100):
    model: CostModel = llama_a100
    assert model.step_time_s(StepShape(num_decode_tokens=1, num_seqs=1)) > 0


def test_short_decode_is_bandwidth_bound_near_weights_over_bandwidth(llama_a100):
    step = StepShape(num_decode_tokens=1, num_context_tokens=128, num_seqs=1)
    # 13.5 GB of weights / 2 TB/s ~ 7 ms, within 2x
    assert 3.5e-3 < llama_a100.step_time_s(step) < 14e-3


def test_long_prefill_is_compute_bound_near_flops_over_peak(llama_a100):
    # 2 x 7e9 x 2048 / 312e12 ~ 90 ms, / 0.6 achievable ~ 150 ms, within 2x
    assert 75e-3 < llama_a100.step_time_s(_prefill(2048)) < 300e-3


def test_decode_batch_costs_far_less_than_separate_steps(llama_a100):
    one = llama_a100.step_time_s(StepShape(num_decode_tokens=1, num_context_tokens=500, num_seqs=1))
    batch = llama_a100.step_time_s(
        StepShape(num_decode_tokens=32, num_context_tokens=32 * 500, num_seqs=32)
    )
    assert batch < 4 * one


def test_a_step_with_no_tokens_takes_no_time(llama_a100):
    assert llama_a100.step_time_s(StepShape()) == 0.0


counts = st.integers(min_value=0, max_value=20_000)
shapes = st.builds(
    StepShape,
    num_prefill_tokens=counts,
    num_decode_tokens=counts,
    num_context_tokens=st.integers(min_value=0, max_value=2_000_000),
    num_seqs=st.integers(min_value=0, max_value=512),
    num_attention_pairs=st.integers(min_value=0, max_value=50_000_000),
)
fields = st.sampled_from([f.name for f in dataclasses.fields(StepShape)])


@given(shape=shapes, field=fields, extra=st.integers(min_value=1, max_value=100_000))
def test_more_work_is_never_cheaper(llama_a100, shape, field, extra):
    bigger = dataclasses.replace(shape, **{field: getattr(shape, field) + extra})
    assert llama_a100.step_time_s(bigger) >= llama_a100.step_time_s(shape)


@given(shape=shapes, field=fields, extra=st.integers(min_value=1, max_value=100_000))
def test_more_work_is_never_cheaper_for_moe_with_tensor_parallelism(shape, field, extra):
    mixtral = RooflineCostModel(
        get_model("mixtral-8x7b"), get_hardware("h100-80g"), page_size=16, tensor_parallel_size=4
    )
    bigger = dataclasses.replace(shape, **{field: getattr(shape, field) + extra})
    assert mixtral.step_time_s(bigger) >= mixtral.step_time_s(shape)


def test_many_small_swaps_cost_more_than_one_large(llama_a100):
    assert llama_a100.swap_time_s(10, num_transfers=10) > llama_a100.swap_time_s(
        10, num_transfers=1
    )


def test_swap_time_is_latency_plus_bytes_over_the_host_link(llama_a100):
    a100 = get_hardware("a100-80g")
    page_bytes = 16 * 512 * 1024
    expected = 3 * a100.host_link_latency_s + 5 * page_bytes / a100.host_link_bandwidth
    assert llama_a100.swap_time_s(5, num_transfers=3) == pytest.approx(expected)


def test_page_copies_are_far_cheaper_than_swaps(llama_a100):
    assert llama_a100.copy_time_s(10) < llama_a100.swap_time_s(10, num_transfers=1) / 10


def test_recompute_costs_a_prefill_step(llama_a100):
    assert llama_a100.recompute_time_s(1000) == llama_a100.step_time_s(_prefill(1000))


def test_recompute_of_nothing_is_free(llama_a100):
    assert llama_a100.recompute_time_s(0) == 0.0


def test_moe_decode_reads_only_the_active_experts():
    mixtral = RooflineCostModel(get_model("mixtral-8x7b"), get_hardware("h100-80g"), page_size=16)
    one = mixtral.step_time_s(StepShape(num_decode_tokens=1, num_seqs=1))
    # 12.9B of 46.7B parameters: a single token's step reads about a quarter of the weights
    full = mixtral.step_time_s(StepShape(num_decode_tokens=64, num_seqs=64))
    assert one < 0.5 * full


def test_tensor_parallelism_speeds_up_a_bandwidth_bound_step():
    llama, h100 = get_model("llama-2-70b"), get_hardware("h100-80g")
    step = StepShape(num_decode_tokens=8, num_context_tokens=8 * 1000, num_seqs=8)
    tp2 = RooflineCostModel(llama, h100, page_size=16, tensor_parallel_size=2)
    tp8 = RooflineCostModel(llama, h100, page_size=16, tensor_parallel_size=8)
    assert tp8.step_time_s(step) < tp2.step_time_s(step)


def test_tensor_parallelism_adds_all_reduce_time_to_a_step():
    llama, h100 = get_model("llama-2-7b"), get_hardware("h100-80g")
    step = StepShape(num_decode_tokens=1, num_seqs=1)
    tp1 = RooflineCostModel(llama, h100, page_size=16)
    tp2 = RooflineCostModel(llama, h100, page_size=16, tensor_parallel_size=2)
    # Halving the work would save half the device time; 64 all-reduces of ~10 us eat into that.
    half = (tp1.step_time_s(step) - h100.step_overhead_s) / 2
    saved = tp1.step_time_s(step) - tp2.step_time_s(step)
    assert 0 < saved < 0.9 * half


def test_tensor_parallel_size_above_the_box_is_a_user_error():
    with pytest.raises(KvlabError, match="exceeds"):
        RooflineCostModel(
            get_model("llama-2-7b"), get_hardware("cpu"), page_size=16, tensor_parallel_size=2
        )


def test_scheduler_output_is_priced_like_the_same_step_shape(llama_a100):
    output = SchedulerOutput(
        step_id=0,

        mem_ops=MemOps(),
        num_prefill_tokens=100,
        num_decode_tokens=3,
        num_context_tokens=400,
        num_attention_pairs=5050,
    )
    shape = StepShape(
        num_prefill_tokens=100,
        num_decode_tokens=3,
        num_context_tokens=400,
        num_seqs=0,
        num_attention_pairs=5050,
    )
    assert llama_a100.step_time_s(output) == llama_a100.step_time_s(shape)


decode_runs = st.tuples(st.integers(1, 512), st.integers(0, 2_000_000), st.integers(0, 4_000_000))
coefficients = st.floats(min_value=-1e-3, max_value=1e-2, allow_nan=False)


@given(run=decode_runs, tp=st.sampled_from([1, 2, 4]),
       case=st.sampled_from([("llama-2-7b", "a100-80g"), ("mixtral-8x7b", "h100-80g")]))
def test_the_roofline_times_a_decode_step_as_its_shape(run, tp, case):
    """The fast path's timer gives exactly (==) the step time of the same decode-only shape."""
    num_seqs, context, padded = run
    model = RooflineCostModel(get_model(case[0]), get_hardware(case[1]), page_size=16,
                              tensor_parallel_size=tp)
    shape = StepShape(num_decode_tokens=num_seqs, num_context_tokens=context, num_seqs=num_seqs,
                      num_padded_context_tokens=padded)
    assert decode_step_timer(model)(num_seqs)(context, padded) == model.step_time_s(shape)


@given(run=decode_runs, values=st.lists(coefficients, min_size=8, max_size=8),
       first_decodes=st.sampled_from([0.0, 4.0, 16.0, 32.0]))
def test_a_calibrated_model_times_a_decode_step_as_its_shape(run, values, first_decodes):
    num_seqs, context, padded = run
    names = ["step_overhead_s", "prefill_token_s", "decode_token_s", "context_token_s",
             "attention_pair_s", "seq_s", "padded_context_token_s", "first_decode_token_s"]
    model = CalibratedCostModel(**dict(zip(names, values, strict=True)),
                                first_decodes=first_decodes)
    shape = StepShape(num_decode_tokens=num_seqs, num_context_tokens=context, num_seqs=num_seqs,
                      num_padded_context_tokens=padded)
    assert decode_step_timer(model)(num_seqs)(context, padded) == model.step_time_s(shape)


def test_a_subclass_with_its_own_step_time_gets_no_decode_timer(llama_a100):
    class Doubled(RooflineCostModel):
        def step_time_s(self, shape):
            return 2 * super().step_time_s(shape)

    doubled = Doubled(get_model("llama-2-7b"), get_hardware("a100-80g"), page_size=16)
    assert decode_step_timer(doubled) is None
    assert decode_step_timer(llama_a100) is not None


def test_the_bent_decode_term_charges_only_a_steps_first_decodes():
    line = CalibratedCostModel(step_overhead_s=1e-3, decode_token_s=1e-4)
    bent = CalibratedCostModel(step_overhead_s=1e-3, decode_token_s=1e-4,
                               first_decode_token_s=5e-4, first_decodes=8.0)
    for decodes, extra in ((1, 5e-4), (8, 8 * 5e-4), (64, 8 * 5e-4)):
        shape = StepShape(num_decode_tokens=decodes, num_seqs=decodes)
        assert bent.step_time_s(shape) - line.step_time_s(shape) == pytest.approx(extra)
    prefill_only = StepShape(num_prefill_tokens=100, num_seqs=1)
    assert bent.step_time_s(prefill_only) == line.step_time_s(prefill_only)
    # a slower machine slows the term, not the count of decodes it covers
    slowed = bent.scaled(2.0)
    assert slowed.first_decode_token_s == pytest.approx(1e-3) and slowed.first_decodes == 8.0
