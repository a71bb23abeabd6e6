"""docs/experiments/scheduling_figure.py: its figure of a sweep over scheduling_policy, with
per-class panels for a workload with SLO classes, and its user errors."""

from __future__ import annotations

from tests.dashboard.test_experiment_scripts import EXPERIMENTS
from tests.dashboard.test_experiment_scripts import _script as _experiment_script


def _script():
    return _experiment_script("scheduling_figure")


def _sweep(path):
    from kvlab.sweep import SerialExecutor, SweepSpec, SweepStore, run_sweep

    spec = SweepSpec.create(
        {"dataset_name": "workload", "num_prompts": 60, "model": "llama-3.1-8b",
         "dataset_path": str(EXPERIMENTS / "scheduling" / "two-class.yaml"),
         "enable_prefix_caching": True},
        {"scheduling_policy": ["fcfs", "priority"], "num_gpu_blocks_override": [1500, 3000]})
    run_sweep(spec.points(), SweepStore(path), SerialExecutor())
    return path


def test_the_figure_has_a_panel_per_class_and_a_group_per_cache_size(tmp_path, capsys):
    folder = _sweep(tmp_path / "orders.parquet")
    out = tmp_path / "orders.html"
    assert _script().main([str(folder), str(out), "--by", "num_gpu_blocks_override"]) == 0
    assert "4 runs" in capsys.readouterr().out
    html = out.read_text()
    for title in ("prefix hit rate (%)", "chat: within SLO (%)", "batch: within SLO (%)",
                  "Jain's fairness", "num_gpu_blocks_override=1500"):
        assert title in html


def test_a_bad_setting_names_the_swept_ones(tmp_path, capsys):
    folder = _sweep(tmp_path / "orders.parquet")
    assert _script().main([str(folder), str(tmp_path / "x.html"), "--by", "router"]) == 2
    assert "--by router: no setting 'router'; swept: scheduling_policy, " \
        "num_gpu_blocks_override" in capsys.readouterr().err
