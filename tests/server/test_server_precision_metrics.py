"""`/metrics` of a server demoting pages: the pages at each precision level and the pages
demoted into each, as the engine's manager counts them (server/metrics.py)."""

from __future__ import annotations

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.engine.replay import run_trace
from kvlab.engine.sampler import SamplingParams
from kvlab.metrics import summarize
from kvlab.policies.serving import ServingConfig
from kvlab.server.metrics import ServerMetrics
from kvlab.traces import Trace, TraceRequest, synthesize_prompt_ids


def _series(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for line in metrics.exposition().decode().splitlines():
        if line.startswith(("kvlab:kv_pages_at_precision{", "kvlab:kv_page_demotions_total{")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_demoting_server_exports_its_precision_mix():
    engine = LLMEngine(EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4,precision=age:recent=4,depth=2", num_gpu_blocks_override=64)))
    metrics = ServerMetrics("tiny", engine.manager, {"block_size": "4"}, "paged")
    assert all(value == 0 for value in _series(metrics).values())
    trace = Trace("test", "mooncake", "synthetic",
                  [TraceRequest(i, 0.0, 12 + 4 * i, 10) for i in range(3)], {})
    result = run_trace(engine, synthesize_prompt_ids(trace, engine.model_config.vocab_size))
    metrics.observe_state(engine.scheduler)
    series = _series(metrics)
    labels = 'dtype="{1}",level="{0}",model_name="tiny"'  # (sorted, as Prometheus writes them)
    summary = summarize(result)
    for level, dtype in ((1, "fp8_e4m3"), (2, "int4_per_token_head")):
        demoted = series["kvlab:kv_page_demotions_total{" + labels.format(level, dtype) + "}"]
        assert demoted == summary[f"precision_demotions_{level}_{dtype}"] > 0
    last = {level: result.steps.columns[f"num_pages_at_level_{level}"][-1] for level in range(3)}
    for level, dtype in enumerate(("auto", "fp8_e4m3", "int4_per_token_head")):
        assert series["kvlab:kv_pages_at_precision{" + labels.format(level, dtype) + "}"] \
            == last[level]
    metrics.observe_state(engine.scheduler)  # (a counter counts each demotion once)
    assert _series(metrics) == series


def test_kv_usage_is_the_bytes_held_pages_fill():
    """Mid-run, with pages demoted: the usage gauge is the held pages less the whole pages
    their demotion spared, over the device's pages (the pool's page ids are more)."""
    engine = LLMEngine(EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4,precision=age:recent=4,depth=2", num_gpu_blocks_override=64)))
    metrics = ServerMetrics("tiny", engine.manager, {"block_size": "4"}, "paged")
    requests = [engine.make_request([(7 * i + j) % 97 + 1 for j in range(40)],
                                    SamplingParams(max_tokens=30, ignore_eos=True),
                                    request_id=i) for i in range(3)]
    steps = engine.iter_run(requests)
    for _ in range(12):
        next(steps)
    manager = engine.manager
    spared = manager.precision.ledger.num_spared_pages
    used = manager.usage().num_used_pages
    assert spared > 0 and manager.usage().num_total_pages > manager.num_total_pages
    metrics.observe_state(engine.scheduler)
    gauge = [line for line in metrics.exposition().decode().splitlines()
             if line.startswith("vllm:kv_cache_usage_perc{")]
    assert float(gauge[0].rsplit(" ", 1)[1]) == (used - spared) / manager.num_total_pages


def test_a_plain_server_exports_no_precision_series():
    engine = LLMEngine(EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4", num_gpu_blocks_override=16)))
    metrics = ServerMetrics("tiny", engine.manager, {"block_size": "4"}, "paged")
    assert "kv_pages_at_precision" not in metrics.exposition().decode()
