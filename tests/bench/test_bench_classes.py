"""`kvlab bench serve` of a workload with SLO classes against `kvlab serve --scheduling-policy
priority`: each request is sent with its priority, the report has the per-class metrics, and a
saved result reads back with its classes."""

from __future__ import annotations

import json

import pytest

from kvlab.bench import load_bench_result
from kvlab.cli import main
from kvlab.engine.config import EngineConfig
from kvlab.fidelity import server_serving
from kvlab.policies.serving import ServingConfig
from tests.live_server import record_priorities, start_live_server

SPEC = """\
num_prompts: 12
classes:
  - name: chat
    rate: 50
    priority: 0
    input_len: {mean: 24, range_ratio: 0.5}
    output_len: 8
    slo: {ttft: 5000}
  - name: batch
    rate: 25
    priority: 1
    input_len: 60
    output_len: 16
"""


@pytest.fixture(scope="module")
def priority_live():
    engine = EngineConfig(model="tiny-llama", serving=ServingConfig.create(
        "paged:block_size=4", num_gpu_blocks_override=40, max_model_len=128,
        scheduling_policy="priority"))
    server = start_live_server(engine)
    yield server
    server.stop()


def test_a_classed_workload_is_reported_per_class_and_saved_with_its_classes(
        priority_live, tmp_path, monkeypatch, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    seen = record_priorities(priority_live, monkeypatch)
    code = main(["bench", "serve", "--base-url", priority_live.base_url, "--dataset-name",
                 "workload", "--dataset-path", str(spec), "--ignore-eos", "--save-result",
                 "--save-detailed", "--result-dir", str(tmp_path), "--label", "classes",
                 "--disable-tqdm"])
    assert code == 0
    assert "SLO Classes" in capsys.readouterr().out
    (path,) = tmp_path.glob("classes-*.json")
    document = json.loads(path.read_text())
    assert set(document["classes"]) == {"chat", "batch"}
    assert document["classes"]["chat"]["completed"] + document["classes"]["batch"][
        "completed"] == 12
    assert sorted(seen) == sorted(document["kvlab_priorities"]) and set(seen) == {0, 1}
    result = load_bench_result(path)
    loaded = result.summary()
    assert loaded["classes"]["chat"]["goodput_perc"] == pytest.approx(
        document["classes"]["chat"]["goodput_perc"])
    assert loaded["num_priority_inversions"] == document["num_priority_inversions"]
    # the server exports its scheduling policy, and its simulator (validate --base-url,
    # calibrate --from-bench) runs it; vLLM exports none: the flag gives it
    assert server_serving(result.server).scheduling_policy == "priority"
    assert server_serving(result.server, preset="vllm").scheduling_policy == "fcfs"
    assert server_serving(result.server, preset="vllm", overrides={
        "scheduling_policy": "priority"}).scheduling_policy == "priority"
