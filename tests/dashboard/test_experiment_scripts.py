"""The figure scripts of docs/experiments (tier_figure.py, sweep_heatmap.py): their figures
from a sweep folder, and their user errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[2] / "docs" / "experiments"


def _script(name: str = "tier_figure"):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
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


def test_the_heatmap_of_a_sweep_is_written(tmp_path, capsys):
    folder = _sweep(tmp_path / "tiers.parquet")
    out = tmp_path / "heat.html"
    heatmap = _script("sweep_heatmap")
    assert heatmap.main([str(folder), str(out), "--x", "kv_tiers", "--y", "kv_tier_overlap",
                         "--metric", "mean_ttft_ms"]) == 0
    assert "4 runs" in capsys.readouterr().out and "mean TTFT" in out.read_text()
    assert heatmap.main([str(folder), str(out), "--x", "router"]) == 2
    assert "'router': not a swept setting" in capsys.readouterr().err
