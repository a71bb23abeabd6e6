"""kvlab.bench: measuring OpenAI-compatible servers (kvlab's, vLLM's, vLLM-Ascend's): the
`kvlab bench serve` client, its results in vLLM's keys, and reading a server's Prometheus
`/metrics` (layer 3, never torch)."""

from kvlab.bench.client import ClientConfig, ClientRun, PlannedRequest, run_client, wait_ready
from kvlab.bench.observed import (
    ServerInfo,
    kv_summary,
    metrics_series,
    preemptions_per_request,
    server_info,
)
from kvlab.bench.records import BenchRequest
from kvlab.bench.request_plan import plan_requests, resolve_model, vocab_size_of
from kvlab.bench.result import BenchResult
from kvlab.bench.result_files import load_bench_result
from kvlab.bench.scrape import MetricsSample, parse_metrics, scrape_metrics
from kvlab.bench.serve import bench_serve

__all__ = [
    "BenchRequest",
    "BenchResult",
    "ClientConfig",
    "ClientRun",
    "MetricsSample",
    "PlannedRequest",
    "ServerInfo",
    "bench_serve",
    "kv_summary",
    "load_bench_result",
    "metrics_series",
    "parse_metrics",
    "plan_requests",
    "preemptions_per_request",
    "resolve_model",
    "run_client",
    "scrape_metrics",
    "server_info",
    "vocab_size_of",
    "wait_ready",
]
