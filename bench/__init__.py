"""kvlab.bench: measuring OpenAI-compatible servers (kvlab's, vLLM's, vLLM-Ascend's): reading
their Prometheus `/metrics` (layer 3, never torch)."""

from kvlab.bench.scrape import MetricsSample, parse_metrics, scrape_metrics

__all__ = ["MetricsSample", "parse_metrics", "scrape_metrics"]
