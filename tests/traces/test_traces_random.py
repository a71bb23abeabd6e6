"""The vLLM-style synthetic `random` workload and its shared-prefix groups."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.traces import load_random


def test_defaults_give_1000_requests_of_fixed_length_at_time_zero():
    trace = load_random()
    assert len(trace) == 1000
    assert {(r.input_len, r.output_len, r.arrival_s) for r in trace.requests} == {(1024, 128, 0)}
    assert all(r.hash_ids is None for r in trace.requests)
    assert (trace.dataset_name, trace.source) == ("random", "synthetic")


def test_lengths_stay_within_the_range_ratio_bounds():
    trace = load_random(num_prompts=4000, random_input_len=100, random_output_len=10,
                        random_range_ratio=0.5)
    inputs = np.array([r.input_len for r in trace.requests])
    outputs = np.array([r.output_len for r in trace.requests])
    assert (inputs.min(), inputs.max()) == (50, 150)
    assert (outputs.min(), outputs.max()) == (5, 15)


def test_same_seed_same_trace_and_another_seed_differs():
    options = {"num_prompts": 50, "random_range_ratio": 0.3, "random_prefix_len": 40}
    assert load_random(seed=7, **options).requests == load_random(seed=7, **options).requests
    assert load_random(seed=7, **options).requests != load_random(seed=8, **options).requests


def test_prompt_length_includes_the_prefix():
    trace = load_random(num_prompts=3, random_input_len=10, random_prefix_len=32)
    assert {r.input_len for r in trace.requests} == {42}


@settings(max_examples=40, deadline=None)
@given(prefix_len=st.integers(1, 80), input_len=st.integers(0, 60),
       num_groups=st.integers(1, 4), seed=st.integers(0, 1000))
def test_prefix_groups_share_hash_ids_exactly_on_full_prefix_blocks(
        prefix_len, input_len, num_groups, seed):
    trace = load_random(num_prompts=12, seed=seed, random_input_len=input_len,
                        random_range_ratio=0.5, random_prefix_len=prefix_len,
                        num_prefix_groups=num_groups)
    num_shared = prefix_len // 16
    for i, a in enumerate(trace.requests):
        assert a.hash_block_size == 16
        assert len(a.hash_ids) == math.ceil(a.input_len / 16)
        for j, b in enumerate(trace.requests[:i]):
            common = sum(1 for _ in zip(a.hash_ids, b.hash_ids, strict=False))
            equal = [x == y for x, y in zip(a.hash_ids, b.hash_ids, strict=False)]
            same_group = i % num_groups == j % num_groups
            assert equal == [same_group and k < num_shared for k in range(common)]


@pytest.mark.parametrize("options, flag", [
    ({"random_input_len": -1}, "random_input_len"),
    ({"random_output_len": 0}, "random_output_len"),
    ({"random_range_ratio": 1.0}, "random_range_ratio"),
    ({"random_prefix_len": -5}, "random_prefix_len"),
    ({"random_prefix_len": 16, "num_prefix_groups": 0}, "num_prefix_groups"),
    ({"num_prefix_groups": 2}, "num_prefix_groups"),
    ({"random_input_len": 0}, "random_input_len"),
    ({"num_prompts": 0}, "num_prompts"),
])
def test_bad_option_names_its_setting(options, flag):
    with pytest.raises(KvlabError, match=f"^{flag} "):
        load_random(**options)
