"""A registered policy with its own parameters (`slru:protected_share=0.5`): one spec string
for kvlab's simulator and engine, and for the vLLM plugin's KVLAB_VLLM_EVICTION."""

from __future__ import annotations

import pytest

from kvlab.errors import KvlabError
from kvlab.policies import KVCacheManager, parse_policy, registry
from kvlab.policies.eviction.slru import SLRUEviction


def test_the_manager_builds_the_eviction_policy_with_its_parameters():
    spec = parse_policy("paged:eviction=slru:protected_share=0.5")
    manager = KVCacheManager(spec, 64, max_model_len=256)
    assert isinstance(manager.evictor, SLRUEviction)
    assert manager.evictor.protected_share == 0.5
    assert parse_policy(spec.to_string()) == spec


def test_a_bare_name_is_the_registered_entry_itself():
    assert registry.get("eviction", "slru") is registry.get("eviction", "slru")
    assert registry.get("eviction", "slru").factory().protected_share == 0.8


@pytest.mark.parametrize("text, says", [
    ("paged:eviction=slru:share=0.5", "slru has no parameter 'share'; its parameters: "
                                      "protected_share"),
    ("paged:eviction=slru:protected_share=2", "slru refuses these parameters "
                                              "(protected_share=2.0): protected_share must be "
                                              "in [0, 1]"),
    ("paged:precision=age:recent=0", "age refuses these parameters (recent=0): recent must "
                                     "be >= 1"),
    ("paged:precision=age:cached=1,recompute=1", "cached=1 needs recompute=0"),
    ("paged:eviction=lfu:x=1", "lfu has no parameter 'x'; its parameters: none"),
    ("paged:eviction=bogus:x=1", "eviction='bogus:x=1'; valid: arc, cost, fifo"),
    ("paged:eviction=slru:protected_share=most", "protected_share='most' is not a number"),
])
def test_a_bad_parameter_is_a_user_error_naming_it(text, says):
    with pytest.raises(KvlabError) as error:
        parse_policy(text)
    assert says in str(error.value)


def test_an_unknown_name_is_still_a_key_error():
    with pytest.raises(KeyError):
        registry.get("eviction", "bogus:x=1")


def test_kvlab_policies_shows_each_policys_own_parameters(capsys):
    from kvlab.cli import main

    assert main(["policies"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  slru "))
    assert line.endswith("(slru:protected_share=0.8)")
