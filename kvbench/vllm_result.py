"""A result that vLLM's own `vllm bench serve --save-result --save-detailed` wrote, read as a
`BenchResult`, so that `calibrate --from-bench` and `validate --from-bench` take it beside
kvlab's own.

vLLM's file has the per-request arrays the fit needs (`input_lens`, `output_lens`, `ttfts`,
`itls`, `latencies`, `start_times`, `errors`) but none of what kvlab's client adds: no scrapes
of the server's /metrics (so no cache_config_info: the page size and count come from flags, no
TTFT histogram: the API latency is fitted from the TTFT residuals, no step counter: the
reconstructed steps are not checked), no prompt content (every prompt is its own: prefix hits
cannot be replayed) and no asked-for output length (a failed request asked for nothing
known). `VLLM_BENCH_LIMITS` says so, for the commands to print.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvlab.bench.observed import ServerInfo
from kvlab.bench.records import BenchRequest
from kvlab.metrics import RunResult, StepRecorder
from kvlab.policies import RequestStatus

# The arrays a vLLM result must hold to be read (vLLM keeps them only with --save-detailed).
VLLM_DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                      "errors")
VLLM_BENCH_LIMITS = (
    "a `vllm bench serve` result has no /metrics scrapes: the page size and count come from "
    "--block-size and --num-gpu-blocks-override, the API latency is fitted from TTFT "
    "residuals instead of the server's TTFT histogram, the streamed steps are not checked "
    "against the server's step count, and prompts share no prefix (vLLM saves no prompt "
    "content)"
)


def is_vllm_bench_result(document: Any) -> bool:
    """Whether a JSON document looks like `vllm bench serve`'s result (its `backend` and
    `duration` keys, no kvlab format)."""
    return (isinstance(document, dict) and "format" not in document
            and "duration" in document and ("backend" in document or "model_id" in document))


def missing_vllm_keys(document: dict[str, Any]) -> list[str]:
    """The per-request arrays a vLLM result lacks (all of them without --save-detailed)."""
    return [key for key in VLLM_DETAILED_KEYS if key not in document]


def from_vllm_document(d: dict[str, Any]) -> dict[str, Any]:
    """The BenchResult fields (keyword arguments: kvlab.bench.result holds it, this module
    sits below it) of a `vllm bench serve --save-detailed` document: request i is the
    i-th of its arrays, sent at `start_times[i]` less the first send; one token per streamed
    chunk (vLLM's client counts a chunk's tokens only in `output_lens`: the last chunk takes
    what is left over)."""
    starts = [float(t) for t in d["start_times"]]
    origin = min(starts) if starts else 0.0
    requests = [_request(d, i, start - origin) for i, start in enumerate(starts)]
    completed = [r for r in requests if r.completed]
    itls = [gap for r in completed for gap in r.itls_s()]
    info = ServerInfo(model=str(d.get("model_id") or d.get("model") or "unknown"),
                      owned_by="vllm")
    metadata: dict[str, Any] = {"backend": d.get("backend", "vllm"),
                "endpoint_type": d.get("endpoint_type", "openai"), "model": info.model,
                "hardware": "server (vllm)", "dataset": "vllm-bench",
                "dataset_name": "vllm-bench",
                **{k: d[k] for k in ("request_rate", "burstiness", "max_concurrency", "label")
                   if k in d}}
    run = RunResult(requests=requests, steps=StepRecorder(),
                    itls_s=np.array(itls, dtype=np.float64), duration_s=float(d["duration"]),
                    page_size=0, num_total_pages=0, kv_cache_size_tokens=0, metadata=metadata)
    return {"run": run, "server": info, "series": {}, "started_at": origin,
            "metrics_errors": [VLLM_BENCH_LIMITS], "hash_ids": [None] * len(requests),
            "hash_block_size": 16}


def _request(d: dict[str, Any], i: int, arrival_s: float) -> BenchRequest:
    """Request i of the document, on the run's clock."""
    error = d["errors"][i] or None
    output_len = int(d["output_lens"][i] or 0)
    record = BenchRequest(i, int(d["input_lens"][i]), max(1, output_len), arrival_s)
    record.arrival_s = arrival_s
    record.error = error
    gaps = [float(g) for g in d["itls"][i] or ()]
    if error is None and output_len > 0:
        first = arrival_s + float(d["ttfts"][i])
        record.chunk_times_s = [first, *(first + np.cumsum(gaps)).tolist()]
        chunks = len(record.chunk_times_s)
        record.chunk_tokens = [1] * (chunks - 1) + [max(1, output_len - chunks + 1)]
        record.num_output_tokens = output_len
        record.finish_s = arrival_s + float(d["latencies"][i])
        record.status = RequestStatus.FINISHED_LENGTH
    else:
        record.finish_s = arrival_s
        record.status = RequestStatus.FINISHED_ERROR
    texts = d.get("generated_texts")
    record.generated_text = str(texts[i] or "") if texts else ""
    return record
