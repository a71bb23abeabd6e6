"""`cached=1` looks at the next cached-free victims again only after the pool changed its
cached-free pages (`CachedVictims`): that memo never changes a run, for any eviction policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.metrics import summarize
from kvlab.policies.precision.cached import CachedVictims
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig, simulate
from kvlab.traces import load_trace


def _run(trace, policy: str, num_pages: int, decode_runs: bool):
    serving = ServingConfig.create(policy, num_gpu_blocks_override=num_pages, max_num_seqs=8,
                                   max_model_len=256, enable_prefix_caching=True)
    config = SimConfig(model="llama-2-7b", hardware="a100-80g", serving=serving)
    return simulate(trace, config, decode_runs=decode_runs)


def _always_look(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """CachedVictims without its memo: it reads the victims' levels at every call. Returns a
    list that counts the calls whose memo would have skipped the read."""
    skipped: list[int] = []
    to_demote = CachedVictims.to_demote

    def looking(self: CachedVictims) -> list[int]:
        if self.ledger.num_cache_changes == self._clean_at:
            skipped.append(1)
        self._clean_at = -1
        return to_demote(self)

    monkeypatch.setattr(CachedVictims, "to_demote", looking)
    return skipped


@settings(max_examples=25, deadline=None)
@given(eviction=st.sampled_from(["lru", "arc", "slru", "lfu", "fifo"]),
       precision=st.sampled_from(["age:recent=8", "age:recent=16,depth=2",
                                  "age:recent=8,depth=2,pressure=0.5"]),
       num_pages=st.integers(40, 300), rate=st.sampled_from([5.0, 50.0]),
       decode_runs=st.booleans(), seed=st.integers(0, 1000))
def test_the_memo_of_clean_victims_changes_no_run(eviction, precision, num_pages, rate,
                                                   decode_runs, seed):
    trace = load_trace("random", num_prompts=24, seed=seed, random_input_len=24,
                       random_output_len=40, random_range_ratio=0.9, request_rate=rate,
                       random_prefix_len=16, num_prefix_groups=3)
    policy = f"paged:block_size=4,eviction={eviction},precision={precision}"  # (cached=1)
    memo = _run(trace, policy, num_pages, decode_runs)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _always_look(monkeypatch)
        looked = _run(trace, policy, num_pages, decode_runs)
    for name, column in looked.steps.columns.items():
        np.testing.assert_array_equal(np.asarray(memo.steps.columns[name]),
                                      np.asarray(column), err_msg=name)
    assert summarize(memo) == summarize(looked)


def test_the_memo_skips_reads_on_a_trace_with_prefix_hits(monkeypatch):
    """Not a memo that never applies: on a prefix-sharing trace most calls are skipped."""
    trace = load_trace("random", num_prompts=24, seed=3, random_input_len=24,
                       random_output_len=40, random_range_ratio=0.9, request_rate=50.0,
                       random_prefix_len=16, num_prefix_groups=3)
    skipped = _always_look(monkeypatch)
    _run(trace, "paged:block_size=4,eviction=lru,precision=age:recent=8", 200, False)
    assert len(skipped) > 10
