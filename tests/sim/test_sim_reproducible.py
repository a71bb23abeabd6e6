"""The same simulation gives the same summary, to the last bit, in any process.

A sweep runs its simulations in other processes (a local pool, Ray workers): a sum whose order
follows the process (a set's hash seed, BLAS's thread count, which Ray sets to one) would give
rows that differ in their last digits.
"""

from __future__ import annotations

import os
import subprocess
import sys

_RUN = """
import json
from kvlab.metrics import summarize
from kvlab.policies.serving import ServingConfig
from kvlab.policies.tiers import TiersConfig, parse_tiers
from kvlab.sim import SimConfig, simulate
from kvlab.traces import load_trace

summaries = []
for tiers in ("", "host:4GiB"):
    serving = ServingConfig.create("paged", enable_prefix_caching=True,
                                   kv_tiers=TiersConfig(parse_tiers(tiers)))
    config = SimConfig(model="llama-2-7b", hardware="a100-80g", serving=serving)
    summary = summarize(simulate(load_trace("azure", "azure-conv"), config))
    summary.pop("date", None)
    summaries.append(summary)
print(json.dumps(summaries, sort_keys=True))
"""


def _summaries(hash_seed: str, threads: str | None) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
        if threads is not None:
            env[name] = threads
    result = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_summaries_are_byte_equal_across_hash_seeds_and_blas_threads() -> None:
    one = _summaries("1", threads="1")
    other = _summaries("2", threads=None)
    assert one == other
    assert '"kv_token_state_perc"' in one
