"""docs/experiments/tier_figure.py: the figure of a kv_tiers sweep, and its user errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "experiments" / "tier_figure.py"


def _script():
    spec = importlib.util.spec_from_file_location("tier_figure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sweep(path):
    from kvlab.sweep import SerialExecutor, SweepSpec, SweepStore, run_sweep

    spec = SweepSpec.create({"dataset_name": "mooncake", "num_prompts": 40,
                             "model": "llama-3.1-8b", "hardware": "h200-141g"},
                            {"kv_tiers": ["none", "host:64GiB"], "kv_tier_overlap":
                             ["none", "layerwise"]})
    run_sweep(spec.points(), SweepStore(path), SerialExecutor())
    return path


def test_the_figure_of_a_tier_sweep_is_written(tmp_path, capsys):
    folder = _sweep(tmp_path / "tiers.parquet")
    out = tmp_path / "tiers.html"
    assert _script().main([str(folder), str(out), "--where", "kv_tier_overlap=none"]) == 0
    assert "2 configurations" in capsys.readouterr().out
    html = out.read_text()
    assert "device hits (%)" in html and "host hits (%)" in html


def test_a_bad_filter_names_the_swept_settings(tmp_path, capsys):
    folder = _sweep(tmp_path / "tiers.parquet")
    assert _script().main([str(folder), str(tmp_path / "x.html"), "--where", "eviction=lru"]) == 2
    assert "no setting 'eviction'; swept: kv_tiers, kv_tier_overlap" in capsys.readouterr().err
