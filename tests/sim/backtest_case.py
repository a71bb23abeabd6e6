"""The simulator back-test case: a fixed excerpt, config and policies, and its stored summaries.

The stored file is regenerated only on purpose, after a change that is meant to move the numbers:
    .venv/bin/python tests/sim/backtest_case.py --regenerate
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvlab.metrics import summarize
from kvlab.policies.serving import GiB, ServingConfig
from kvlab.sim import SimConfig, simulate
from kvlab.traces import load_trace

STORED = Path(__file__).resolve().parents[1] / "data" / "sim_backtest_azure_conv.json"
# Recompute and swap preemption on a KV cache small enough (1,500 pages, 24k tokens) that the
# 4x-compressed excerpt preempts, with prefix-free Azure prompts.
POLICIES = ("paged", "paged:preemption=swap", "contiguous:reserve=pow2")


def run_case() -> dict[str, dict]:
    """Summaries of the back-test case, keyed by policy spec."""
    trace = load_trace("azure", num_prompts=400, time_scale=4.0)
    # (a swap space of every device page: the case predates the simulator's --swap-space)
    serving = ServingConfig(num_gpu_blocks_override=1500, max_num_batched_tokens=4096,
                            swap_space_bytes=16 * GiB)
    config = SimConfig(serving=serving)
    summaries = {}
    for policy in POLICIES:
        result = simulate(trace, config.with_policy(policy))
        summaries[policy] = summarize(
            result, percentile_metrics=("ttft", "tpot", "itl", "e2el"), metric_percentiles=(50, 99)
        )
    return summaries


def main() -> None:
    """Write the stored summaries (only with --regenerate)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--regenerate", action="store_true", help="overwrite " + STORED.name)
    if not parser.parse_args().regenerate:
        parser.error("nothing to do: pass --regenerate to overwrite the stored summaries")
    STORED.write_text(json.dumps(run_case(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {STORED}")


if __name__ == "__main__":
    main()
