"""KVLAB_VLLM_EVICTION: kvlab's eviction spec grammar, read by the vLLM plugin at start."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.integrations.vllm.setting import eviction_from_env, parse_eviction
from kvlab.policies.eviction.arc import ARCEviction
from kvlab.policies.eviction.slru import SLRUEviction


def test_an_unset_variable_asks_for_nothing():
    assert eviction_from_env({}) is None
    assert eviction_from_env({"KVLAB_VLLM_EVICTION": "  "}) is None


@pytest.mark.parametrize("name", ["arc", "lfu", "slru", "cost", "fifo", "lru"])
def test_each_registered_policy_is_built_by_name(name):
    choice = eviction_from_env({"KVLAB_VLLM_EVICTION": name})
    assert choice is not None and choice.spec == name
    assert len(choice.factory()()) == 0  # a fresh, empty policy object


def test_the_policys_own_parameters_reach_it():
    choice = parse_eviction("slru:protected_share=0.5")
    policy = choice.factory()()
    assert isinstance(policy, SLRUEviction) and policy.protected_share == 0.5
    assert choice.spec == "slru:protected_share=0.5"
    arc = parse_eviction("arc:num-total-pages=64").factory()()
    assert isinstance(arc, ARCEviction)


# (the parameters' own checks: tests/policies/test_policy_params.py)
@pytest.mark.parametrize("text, says", [
    ("bogus", "unknown eviction policy 'bogus'; valid: arc, cost, fifo, lfu, lru, slru"),
    ("none", "--no-enable-prefix-caching"),
    ("slru:protected_share", "'protected_share' is not key=value"),
    ("arc:num_total_pages=1.5", "num_total_pages='1.5' is not a whole number"),
])
def test_a_bad_value_names_the_variable(text, says):
    with pytest.raises(KvlabError) as error:
        parse_eviction(text)
    assert "KVLAB_VLLM_EVICTION" in str(error.value) and says in str(error.value)
