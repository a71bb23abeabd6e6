"""The benchmark of a live `kvlab serve` that the calibration-from-bench tests read: served and
measured anew (`bench_live`), or as recorded once (`RECORDED`), for checks whose answer a run
the loaded test machine slowed may tip (a fit's sensitivity to the step time).

Record it again (after a change to the bench result's format) with

    .venv/bin/python -m tests.validate.bench_recording
"""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.bench import BenchResult, ClientConfig, bench_serve, resolve_model
from kvlab.engine.config import EngineConfig
from kvlab.policies.serving import ServingConfig
from kvlab.traces import Trace, TraceRequest
from tests.live_server import start_live_server

BUDGET = 64  # max_num_batched_tokens: prompts of up to 60 tokens chunk across steps
RECORDED = Path(__file__).resolve().parents[1] / "data" / "bench_tiny_llama.json"


def bench_engine() -> EngineConfig:
    """tiny-llama on 400 pages of 4 tokens, steps of at most BUDGET tokens."""
    return EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4", num_gpu_blocks_override=400, max_model_len=128,
        max_num_batched_tokens=BUDGET))


def bench_requests(num: int = 16) -> Trace:
    """`num` requests 40 ms apart, prompts of 20-60 tokens, outputs of 6-16."""
    requests = [TraceRequest(i, 0.04 * i, 20 + (7 * i) % 41, 6 + (5 * i) % 11)
                for i in range(num)]
    return Trace("bench-cal", "random", "synthetic", requests, {})


def bench_live() -> BenchResult:
    """A streamed benchmark of `bench_requests` against a live `kvlab serve` of
    `bench_engine`."""
    server = start_live_server(bench_engine())
    try:
        card = resolve_model(server.base_url, None, None)
        client = ClientConfig(base_url=server.base_url, model=server.model_name,
                              ignore_eos=True, scrape_interval_s=0.05)
        return bench_serve(bench_requests(), client, card=card, vocab_size=card["vocab_size"])
    finally:
        server.stop()


def write_result(result: BenchResult, path: Path) -> Path:
    """`result` saved as `kvlab bench serve --save-result --save-detailed` saves it."""
    path.write_text(json.dumps(result.to_json(result.summary(), detailed=True)))
    return path


if __name__ == "__main__":
    print(write_result(bench_live(), RECORDED))
