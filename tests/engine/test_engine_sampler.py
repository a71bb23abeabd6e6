"""Sampling parameters, the sampler's masks and reproducibility, and the stop decision."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engine.sampler import Sampler, SamplingParams, apply_top_k_top_p, check_stop
from kvlab.errors import KvlabError
from kvlab.policies.request import RequestStatus


def _logits(num_rows: int = 4, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_defaults_are_vllms():
    params = SamplingParams()
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (1.0, 1.0, 0, 16)
    assert params.seed is None and not params.ignore_eos and params.stop_token_ids == ()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.1, "temperature must be a number >= 0"),
        ("temperature", math.nan, "temperature must be a number >= 0"),
        ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
        ("top_p", 1.5, r"top_p must be in \(0, 1\]"),
        ("top_k", -2, "top_k must be a whole number >= 1, or 0 or -1 for off"),
        ("max_tokens", 0, "max_tokens must be a whole number >= 1"),
        ("seed", 1.5, "seed must be a whole number"),
        ("stop_token_ids", (3, -1), "stop_token_ids must be token ids >= 0, got -1"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(field, value, message):
    with pytest.raises(KvlabError, match=message):
        SamplingParams(**{field: value})


def test_greedy_takes_the_argmax():
    logits = _logits()
    tokens = Sampler()(logits, [SamplingParams(temperature=0.0)] * 4, [0, 1, 2, 3])
    assert tokens == logits.argmax(dim=-1).tolist()


def test_top_k_keeps_exactly_the_k_largest():
    logits = _logits()
    masked = apply_top_k_top_p(logits, torch.tensor([1, 3, 0, -1]), torch.ones(4))
    kept = torch.isfinite(masked)
    assert kept.sum(dim=-1).tolist() == [1, 3, 50, 50]
    top3 = logits[1].topk(3).indices
    assert set(kept[1].nonzero().flatten().tolist()) == set(top3.tolist())


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    masked = apply_top_k_top_p(probs.log(), torch.tensor([0]), torch.tensor([0.8]))
    assert torch.isfinite(masked).tolist() == [[True, True, False, False]]
    masked = apply_top_k_top_p(probs.log(), torch.tensor([0]), torch.tensor([0.81]))
    assert torch.isfinite(masked).tolist() == [[True, True, True, False]]


def test_top_p_always_keeps_the_most_likely_token():
    probs = torch.tensor([[0.1, 0.7, 0.2]])
    masked = apply_top_k_top_p(probs.log(), torch.tensor([0]), torch.tensor([0.01]))
    assert torch.isfinite(masked).tolist() == [[False, True, False]]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 1000),
    top_k=st.integers(-1, 60),
    top_p=st.floats(0.05, 1.0),
)
def test_sampled_token_always_survives_the_masks(seed, top_k, top_p):
    logits = _logits(num_rows=1, seed=seed)
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p, seed=seed)
    token = Sampler()(logits, [params], [0])[0]
    masked = apply_top_k_top_p(logits / 0.7, torch.tensor([top_k]), torch.tensor([top_p]))
    assert math.isfinite(masked[0, token])


def test_seeded_request_repeats_its_tokens_whatever_shares_the_batch():
    seeded = SamplingParams(temperature=1.0, seed=1234)
    other = SamplingParams(temperature=1.0)
    sampler = Sampler()
    alone = [sampler(_logits(1, seed=s), [seeded], [7])[0] for s in range(20)]
    sampler = Sampler()
    in_batch = []
    for s in range(20):
        batch = torch.cat([_logits(2, seed=100 + s), _logits(1, seed=s)])
        in_batch.append(sampler(batch, [other, other, seeded], [1, 2, 7])[2])
    assert in_batch == alone


def test_sampling_follows_the_distribution():
    logits = torch.tensor([[0.0, math.log(3.0)]]).repeat(4000, 1)
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(4000)]
    tokens = Sampler()(logits, params, list(range(4000)))
    assert 0.72 < sum(tokens) / 4000 < 0.78  # P(token 1) = 0.75


def test_freed_request_starts_its_seed_over():
    params = [SamplingParams(seed=5)]
    sampler = Sampler()
    first = [sampler(_logits(1, seed=s), params, [0])[0] for s in range(10)]
    sampler.free(0)
    again = [sampler(_logits(1, seed=s), params, [0])[0] for s in range(10)]
    assert first == again


def test_stop_at_max_tokens():
    params = SamplingParams(max_tokens=3)
    assert check_stop(params, [5, 6], eos_token_ids=(2,)) is None
    assert check_stop(params, [5, 6, 7], eos_token_ids=(2,)) is RequestStatus.FINISHED_LENGTH


def test_stop_at_eos_unless_ignored():
    assert check_stop(SamplingParams(), [5, 2], (2,)) is RequestStatus.FINISHED_STOPPED
    assert check_stop(SamplingParams(ignore_eos=True), [5, 2], (2,)) is None


def test_stop_at_a_stop_token_even_when_eos_is_ignored():
    params = SamplingParams(ignore_eos=True, stop_token_ids=[9])
    assert check_stop(params, [5, 9], (2,)) is RequestStatus.FINISHED_STOPPED


def test_length_wins_over_eos_on_the_last_allowed_token():
    assert check_stop(SamplingParams(max_tokens=2), [5, 2], (2,)) is RequestStatus.FINISHED_LENGTH
