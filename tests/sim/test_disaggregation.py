"""Prefill/decode disaggregation in the simulator: every request's first token at a prefill
instance, the rest at a decode instance after its KV crossed the link; conservation, the
link's time, and the fast path exact with handoffs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvlab.errors import KvlabError
from kvlab.metrics import summarize
from kvlab.policies import RequestStatus
from kvlab.policies.serving import ServingConfig
from kvlab.sim import SimConfig, simulate_cluster
from kvlab.sim.disaggregation import parse_pd
from kvlab.traces import load_trace
from tests.sim.test_cluster import assert_same_cluster_run, outcomes

PAGE = 16


def config(num_pages: int = 3000) -> SimConfig:
    serving = ServingConfig.create("paged", enable_prefix_caching=True,
                                   num_gpu_blocks_override=num_pages)
    return SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=serving)


def trace(num_prompts: int = 120, rate: float = 4.0):
    return load_trace("mooncake", num_prompts=num_prompts, request_rate=rate)


def test_pd_parses_and_refuses_what_is_not_two_counts():
    assert parse_pd("2:6") == (2, 6)
    for text in ("2", "2:0", "a:b", "1:2:3"):
        with pytest.raises(KvlabError) as info:
            parse_pd(text)
        assert info.value.parameters == ("pd",)


def test_each_request_prefills_on_one_stage_and_decodes_on_the_other():
    result = simulate_cluster(trace(), config(), pd=(2, 3), router="least-loaded")
    assert result.roles == ["prefill", "prefill", "decode", "decode", "decode"]
    prefill = {r.request_id for run in result.instances[:2] for r in run.requests}
    decode = {r.request_id for run in result.instances[2:] for r in run.requests}
    done = [r for r in result.cluster.requests if r.status is RequestStatus.FINISHED_LENGTH]
    failed = [r for r in result.cluster.requests if r.error is not None]  # longer than memory
    assert len(done) + len(failed) == len(result.cluster.requests) and len(failed) < 10
    assert prefill == {r.request_id for r in result.cluster.requests}  # every arrival there
    assert all("KV pages" in r.error for r in failed)
    assert decode == {r.request_id for r in done if r.max_output_tokens > 1}
    assert all(r.num_output_tokens == r.max_output_tokens for r in done)
    assert set(result.instance_of.values()) <= {0, 1}
    summary = summarize(result.cluster)
    assert summary["pd"] == "2:3" and summary["pd_handoffs"] == len(decode)
    # at most every prompt page: what a decode instance caches already is not sent
    assert 0 < summary["pd_transferred_pages"] <= sum(
        -(-r.prompt_len // PAGE) for r in done if r.max_output_tokens > 1)


def test_only_the_pages_the_decode_instance_lacks_are_sent():
    def sent(eviction: str) -> tuple[int, int]:
        serving = ServingConfig.create(f"paged:eviction={eviction}")  # a whole H200's cache
        cfg = SimConfig(model="llama-3.1-8b", hardware="h200-141g", serving=serving)
        result = simulate_cluster(trace(200), cfg, pd=(1, 1))
        full = sum(-(-r.prompt_len // PAGE) for r in result.cluster.requests
                   if r.error is None and r.max_output_tokens > 1)
        return summarize(result.cluster)["pd_transferred_pages"], full

    cached, full = sent("lru")  # conversation turns share prefixes on the decode instance
    assert cached < full
    uncached, full_again = sent("none")
    assert uncached == full_again


def test_the_link_delays_the_second_token_not_the_first():
    fast = simulate_cluster(trace(), config(), pd=(1, 1), pd_link_bandwidth=100e9)
    slow = simulate_cluster(trace(), config(), pd=(1, 1), pd_link_bandwidth=0.5e9)
    first = {r.request_id: r.first_token_s for r in fast.cluster.requests}
    assert first == {r.request_id: r.first_token_s for r in slow.cluster.requests}
    fast_summary, slow_summary = summarize(fast.cluster), summarize(slow.cluster)
    assert slow_summary["mean_tpot_ms"] > fast_summary["mean_tpot_ms"] + 10
    assert slow_summary["pd_link_busy_s"] > 100 * fast_summary["pd_link_busy_s"] / 300


def test_decode_runs_stay_exact_with_handoffs_on_the_way():
    runs = [simulate_cluster(trace(80), config(), pd=(2, 2), decode_runs=decode_runs)
            for decode_runs in (True, False)]
    assert_same_cluster_run(*runs)


def test_a_decode_instance_short_of_memory_preempts_and_recomputes_there():
    result = simulate_cluster(trace(60, rate=50.0), config(num_pages=1200), pd=(1, 1))
    decode = result.instances[1]
    preempted = [r for r in decode.requests if r.num_preemptions]
    assert preempted and all(r.kv_transfer_tokens == 0 for r in preempted)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in result.cluster.requests
               if r.error is None)
    assert outcomes(result.cluster.requests)  # and run() checked every page came back


def test_pd_and_num_instances_must_agree():
    with pytest.raises(KvlabError) as info:
        simulate_cluster(trace(4), config(), num_instances=3, pd=(1, 1))
    assert info.value.parameters == ("num_instances", "pd")


def test_kvlab_sim_pd_reports_and_saves_the_stages(capsys, tmp_path):
    from kvlab.cli import main

    code = main(["sim", "--dataset-name", "mooncake", "--num-prompts", "40", "--model",
                 "llama-3.1-8b", "--hardware", "h200-141g", "--enable-prefix-caching",
                 "--pd", "1:2", "--pd-link-bandwidth", "25", "--disable-tqdm", "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "pd.json"])
    assert code == 0
    out = capsys.readouterr().out
    assert "Prefill:decode instances:" in out and " prefill " in out and " decode " in out
    saved = json.loads((tmp_path / "pd.json").read_text())
    assert saved["pd"] == "1:2" and saved["num_instances"] == 3
    assert saved["pd_link_bandwidth"] == pytest.approx(25e9)
    assert [i["role"] for i in saved["instances"]] == ["prefill", "decode", "decode"]
    assert np.isfinite(saved["mean_tpot_ms"])
    # a request's first token is its prefill instance's, the rest its decode instance's
    instances = saved["instances"]
    assert instances[0]["total_output_tokens"] == instances[0]["completed"]
    assert sum(i["total_output_tokens"] for i in instances) == saved["total_output_tokens"]


@pytest.mark.parametrize("flags, words", [
    (["--pd", "2"], "--pd '2': expected P:D"),
    (["--pd", "1:1", "--num-instances", "3"], "--num-instances is 3 but --pd 1:1 makes 2"),
    (["--pd", "1:1", "--pd-link-bandwidth", "0"], "--pd-link-bandwidth 0.0: expected GB/s > 0"),
])
def test_bad_pd_flags_name_the_flag(capsys, flags, words):
    from kvlab.cli import main

    assert main(["sim", "--num-prompts", "5", "--disable-tqdm", *flags]) == 2
    assert words in capsys.readouterr().err
