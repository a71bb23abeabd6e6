"""The simulator's fast path (runs of plain decode steps committed at once) gives exactly the
result of stepping every step: the same step rows, request stamps, inter-token gaps and pages,
on whole traces and on random small ones (policies, memory, prefix caching, preemption)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.policies import StepLoop
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig, simulate
from kvlab.sim.simulator import Simulation
from kvlab.traces import load_trace


def _outcome(request):
    return (request.request_id, request.status, request.first_token_s, request.finish_s,
            request.num_output_tokens, request.num_preemptions, request.num_swaps_out,
            request.num_cached_tokens, request.error)


def assert_same_run(trace, config):
    stepped = simulate(trace, config, decode_runs=False)
    fast = simulate(trace, config)
    for name, column in stepped.steps.columns.items():
        np.testing.assert_array_equal(np.asarray(fast.steps.columns[name]), np.asarray(column),
                                      err_msg=name)
    np.testing.assert_array_equal(fast.itls_s, stepped.itls_s)
    assert [_outcome(r) for r in fast.requests] == [_outcome(r) for r in stepped.requests]
    assert fast.duration_s == stepped.duration_s
    return fast


def _config(policy="paged", **serving):
    return SimConfig(model="llama-2-7b", hardware="a100-80g",
                     serving=ServingConfig.create(policy, **serving))


def test_bundled_azure_excerpt_at_its_rate():
    assert_same_run(load_trace("azure", num_prompts=400), _config())


def test_mooncake_with_prefix_caching_and_evictions():
    fast = assert_same_run(load_trace("mooncake", num_prompts=120, length_scale=8),
                           _config("paged:eviction=lru", num_gpu_blocks_override=400,
                                   enable_prefix_caching=True))
    assert fast.steps.columns["num_cached_free_pages"]


def test_preemption_and_swapping_under_a_small_memory():
    trace = load_trace("random", num_prompts=60, seed=2, random_input_len=200,
                       random_output_len=300, random_range_ratio=0.5, request_rate=20.0)
    fast = assert_same_run(trace, _config("paged:preemption=swap", num_gpu_blocks_override=120,
                                          max_num_seqs=16))
    assert sum(r.num_preemptions for r in fast.requests) > 0


def test_the_fast_path_is_taken(monkeypatch):
    """Most steps of a decode-heavy run go through it (else the comparisons above prove
    nothing)."""
    calls = []
    commit = StepLoop.commit_decode_run
    monkeypatch.setattr(StepLoop, "commit_decode_run",
                        lambda loop, s, *rest: calls.append(len(s)) or commit(loop, s, *rest))
    simulation = Simulation(load_trace("azure", num_prompts=200), _config())
    simulation.run()
    assert sum(calls) > len(simulation.loop.steps) / 2


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(["paged", "paged:eviction=lru", "paged:eviction=arc",
                            "paged:eviction=slru", "paged:preemption=swap",
                            "paged:block_sizing=geometric", "buddy", "contiguous:reserve=pow2"]),
    block_size=st.sampled_from([1, 4, 16]),
    num_pages=st.integers(40, 400),
    max_num_seqs=st.sampled_from([2, 8, 64]),
    rate=st.sampled_from([2.0, 20.0, 200.0]),
    seed=st.integers(0, 1000),
    reserve_full_isl=st.booleans(),
)
def test_random_small_runs_match_stepping(policy, block_size, num_pages, max_num_seqs, rate,
                                          seed, reserve_full_isl):
    trace = load_trace("random", num_prompts=24, seed=seed, random_input_len=24,
                       random_output_len=40, random_range_ratio=0.9, request_rate=rate,
                       random_prefix_len=16, num_prefix_groups=3)
    config = _config(policy, block_size=block_size, num_gpu_blocks_override=num_pages * 16
                     // block_size, max_num_seqs=max_num_seqs, max_model_len=256,
                     enable_prefix_caching="eviction" in policy,
                     scheduler_reserve_full_isl=reserve_full_isl)
    assert_same_run(trace, config)


@settings(max_examples=30, deadline=None)
@given(
    precision=st.sampled_from(["age:recent=8", "age:recent=16,depth=2", "age:recent=4,cached=0",
                               "age:recent=32,depth=2,pressure=0.5"]),
    eviction=st.sampled_from(["none", "lru"]),
    num_pages=st.integers(40, 400),
    rate=st.sampled_from([2.0, 20.0, 200.0]),
    seed=st.integers(0, 1000),
)
def test_runs_with_demotion_match_stepping(precision, eviction, num_pages, rate, seed):
    """Decode runs carry age demotions (or stop short of them: pressure); the precision mix is
    the same."""
    from kvlab.metrics import summarize

    trace = load_trace("random", num_prompts=24, seed=seed, random_input_len=24,
                       random_output_len=40, random_range_ratio=0.9, request_rate=rate,
                       random_prefix_len=16, num_prefix_groups=3)
    config = _config(f"paged:block_size=4,eviction={eviction},precision={precision}",
                     num_gpu_blocks_override=num_pages, max_num_seqs=8, max_model_len=256,
                     enable_prefix_caching=eviction != "none")
    fast = assert_same_run(trace, config)
    stepped = simulate(trace, config, decode_runs=False)
    mix = {k: v for k, v in summarize(stepped).items() if k.startswith("precision")}
    assert {k: summarize(fast)[k] for k in mix} == mix


def test_the_fast_path_is_taken_with_demotion(monkeypatch):
    calls = []
    commit = StepLoop.commit_decode_run
    monkeypatch.setattr(StepLoop, "commit_decode_run",
                        lambda loop, s, *rest: calls.append(len(s)) or commit(loop, s, *rest))
    config = _config("paged:eviction=lru,precision=age:recent=128", enable_prefix_caching=True)
    assert_same_run(load_trace("azure", num_prompts=300), config)
    assert sum(calls) > 1000


def _walks_in_runs(monkeypatch):
    """Counts the page walks that decode runs commit (`RunDemotions.commit`)."""
    from kvlab.policies.precision.run import RunDemotions

    walks = []
    commit = RunDemotions.commit

    def counting(run, num_steps, *rest):
        done = commit(run, num_steps, *rest)
        walks.append(sum(len(due) for due in run._dues[:num_steps]))
        return done

    monkeypatch.setattr(RunDemotions, "commit", counting)
    return walks


def test_decode_runs_carry_demotions(monkeypatch):
    walks = _walks_in_runs(monkeypatch)
    config = _config("paged:eviction=lru,precision=age:recent=64,depth=2",
                     enable_prefix_caching=True)
    assert_same_run(load_trace("azure", num_prompts=300), config)
    assert sum(walks) > 1000  # pages demoted inside runs, not only between them


def test_runs_stop_short_of_demotions_where_ratios_are_inexact(monkeypatch):
    from kvlab.policies.precision import driver

    monkeypatch.setattr(driver, "exact_ratios", lambda values: False)
    walks = _walks_in_runs(monkeypatch)
    config = _config("paged:eviction=lru,precision=age:recent=64,depth=2",
                     enable_prefix_caching=True)
    assert_same_run(load_trace("azure", num_prompts=300), config)
    assert walks and not sum(walks)


def test_exact_ratios_are_binary_fractions():
    from kvlab.policies.precision.run import exact_ratios

    assert exact_ratios([1.0, 0.5, 0.265625, 0.734375])
    assert not exact_ratios([0.275])  # 44 / 160: a head_dim of 80's int4 row


def test_runs_charge_demoted_reads_as_stepping_does_under_a_calibrated_model():
    """A calibrated model's `demoted_context_token_s` and `requantize_page_s` are charged by a
    run's timer as by a stepped step: the same durations to the last bit."""
    from kvlab.sim.calibrated import CalibratedCostModel

    model = CalibratedCostModel(step_overhead_s=2e-3, decode_token_s=3e-4,
                                context_token_s=1e-6, demoted_context_token_s=5e-6,
                                copy_page_s=1e-5, requantize_page_s=2e-4)
    trace = load_trace("random", num_prompts=24, seed=3, random_input_len=64,
                       random_output_len=80, random_range_ratio=0.9, request_rate=20.0)
    config = _config("paged:block_size=4,precision=age:recent=16,depth=2",
                     num_gpu_blocks_override=400, max_num_seqs=8, max_model_len=256)
    stepped = simulate(trace, config, cost_model=model, decode_runs=False)
    fast = simulate(trace, config, cost_model=model)
    plain = simulate(trace, config, cost_model=dataclasses.replace(
        model, demoted_context_token_s=0.0))
    for name, column in stepped.steps.columns.items():
        np.testing.assert_array_equal(np.asarray(fast.steps.columns[name]), np.asarray(column),
                                      err_msg=name)
    assert sum(fast.steps.columns["num_saved_context_tokens"]) > 0
    assert sum(fast.steps.columns["num_requantized_pages"]) > 0
    assert fast.duration_s > plain.duration_s  # (the term is charged)
