"""A vLLM running kvlab's plugin tells its eviction policy on /metrics
(`kvlab:eviction_policy_info`), and the replay of validate --lockstep runs that policy."""

from __future__ import annotations

from kvlab.bench.observed import server_info
from kvlab.bench.scrape import parse_metrics
from kvlab.fidelity import server_serving

METRICS = """\
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",num_gpu_blocks="256"} 1.0
# TYPE kvlab:eviction_policy_info gauge
kvlab:eviction_policy_info{kvlab_version="0.1.0",policy="%s"} 1.0
"""
CARD = {"id": "tiny", "owned_by": "vllm", "max_model_len": 2048}


def info_of(metrics: str):
    return server_info(CARD, parse_metrics(metrics))


def test_the_servers_policy_is_read_from_its_metrics():
    assert info_of(METRICS % "arc").eviction == "arc"


def test_the_replay_evicts_by_the_servers_policy_with_its_parameters():
    serving = server_serving(info_of(METRICS % "slru:protected_share=0.5"))
    assert serving.policy.eviction == "slru:protected_share=0.5"
    assert (serving.policy.victim, serving.num_gpu_blocks_override) == ("last-admitted", 255)


def test_a_vllm_without_the_plugin_is_replayed_with_its_lru():
    plain = METRICS.split("# TYPE kvlab")[0]
    info = info_of(plain)
    assert info.eviction is None
    assert server_serving(info).policy.eviction == "lru"
