"""`kvlab sim` resolves its configuration once: one parse of the policy spec, one read of each
preset file, one load of the cost model, however many requests the simulation runs."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import yaml

from kvlab.cli import main
from kvlab.policies import serving, spec
from kvlab.sim import calibrated
from kvlab.specs import get_hardware, get_model, loading


@pytest.fixture
def counted(monkeypatch):
    """Counts of policy parses (of text), spec-file reads and cost-model loads."""
    counts: Counter[str] = Counter()
    parse, load_file, load_model = spec.parse_policy, loading._load_file, calibrated.load_cost_model

    def counting_parse(text):
        if not isinstance(text, spec.PolicySpec):
            counts["policy parses"] += 1
        return parse(text)

    def counting_load_file(path, cls, kind):
        counts[f"{kind} file reads"] += 1
        return load_file(path, cls, kind)

    def counting_load_model(path):
        counts["cost model loads"] += 1
        return load_model(path)

    monkeypatch.setattr(serving, "parse_policy", counting_parse)
    # the CLI builds its ServingConfig as a sweep does (kvlab.sweep.runner.serving_config)
    monkeypatch.setattr("kvlab.sweep.runner.parse_policy", counting_parse)
    monkeypatch.setattr(loading, "_load_file", counting_load_file)
    monkeypatch.setattr("kvlab.sim.config.load_cost_model", counting_load_model)
    return counts


def _files(tmp_path):
    """A model and a hardware spec file (copies of presets), and a calibrated cost model."""
    model_path, hardware_path = tmp_path / "my-llama.yaml", tmp_path / "my-gpu.yaml"
    model = {**dataclasses.asdict(get_model("llama-2-7b")), "name": "my-llama"}
    model_path.write_text(yaml.safe_dump(model))
    hardware_path.write_text(yaml.safe_dump(dataclasses.asdict(get_hardware("a100-80g"))))
    cost_path = tmp_path / "costmodel.json"
    cost_path.write_text(json.dumps(calibrated.CalibratedCostModel(step_overhead_s=0.01).to_json()))
    return model_path, hardware_path, cost_path


def test_one_simulation_parses_its_policy_and_reads_each_file_once(tmp_path, counted, capsys):
    model, hardware, cost = _files(tmp_path)
    code = main(["sim", "--num-prompts", "50", "--model", str(model), "--hardware",
                 str(hardware), "--cost-model", str(cost), "--policy", "paged:eviction=lru",
                 "--block-size", "32", "--enable-prefix-caching", "--disable-tqdm"])
    assert code == 0, capsys.readouterr().err
    assert counted == Counter({"policy parses": 1, "model file reads": 1,
                               "hardware file reads": 1, "cost model loads": 1})


def test_a_comparison_reads_the_files_once_for_every_policy(tmp_path, counted, capsys):
    model, hardware, _ = _files(tmp_path)
    code = main(["sim", "--num-prompts", "20", "--model", str(model), "--hardware",
                 str(hardware), "--compare", "paged", "buddy", "contiguous", "--disable-tqdm"])
    assert code == 0, capsys.readouterr().err
    assert counted == Counter({"policy parses": 3, "model file reads": 1,
                               "hardware file reads": 1})
