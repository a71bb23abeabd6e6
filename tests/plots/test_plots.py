"""kvlab.plots and `kvlab plot`: the figures carry the numbers of the result files, and every
format is written (HTML with plotly.js inlined, PNG and SVG from matplotlib)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.cli import main
from kvlab.plots import SweepData, ValidationData, figures_of, load_results
from kvlab.plots.runs import binned_max, cdf_points

pytest.importorskip("matplotlib")
pytest.importorskip("plotly")

SIM = ["sim", "--num-prompts", "60", "--disable-tqdm"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two runs of the bundled trace saved with --save-result (summary and both tables)."""
    out = tmp_path_factory.mktemp("results")
    assert main([*SIM, "--compare", "paged", "contiguous:reserve=max", "--save-result",
                 "--result-dir", str(out)]) == 0
    return sorted(out.glob("*.json"))


def _panel(figure, title):
    return next(panel for panel in figure.panels if panel.title == title)


def test_a_run_figures_carry_its_tables(saved):
    run = load_results([saved[0]])[0]
    figures = dict((f.name, f) for _, f in figures_of([run]))
    assert set(figures) == {"timeline", "latency"}
    steps = run.steps
    usage = steps["num_used_pages"] * 100.0 / (
        steps["num_used_pages"] + steps["num_cached_free_pages"] + steps["num_free_pages"])
    kv = _panel(figures["timeline"], "KV cache usage").series[0]
    assert max(kv.y) == pytest.approx(usage.max())
    assert max(kv.y) == pytest.approx(run.summary["peak_kv_usage_perc"], rel=1e-6)
    running = _panel(figures["timeline"], "Running requests").series[0]
    assert max(running.y) == steps["num_running"].max()
    finished = run.requests[run.requests["error"].isna()]  # the failed have an error
    ttft = _panel(figures["latency"], "TTFT (ms) CDF").series[0]
    assert ttft.x == pytest.approx(sorted(finished["ttft_ms"]))
    assert ttft.y[-1] == pytest.approx(100.0)


def test_several_runs_are_compared(saved):
    runs = load_results(saved)
    figures = figures_of(runs)
    assert {stem for stem, _ in figures} == {"compare"}
    summary = next(f for _, f in figures if f.name == "summary")
    bars = _panel(summary, "Output throughput (tok/s)").series[0]
    assert bars.y == pytest.approx([run.summary["output_throughput"] for run in runs])
    assert len(set(bars.x)) == len(runs)  # labels told apart


def test_the_command_writes_every_format(saved, tmp_path, capsys):
    assert main(["plot", str(saved[0]), "-o", str(tmp_path)]) == 0
    stem = saved[0].name[: -len(".json")]
    html = (tmp_path / f"{stem}.timeline.html").read_text()
    assert "<script src" not in html and "plotly.js v" in html  # inlined: works offline
    assert "KV cache usage" in html
    svg = (tmp_path / f"{stem}.latency.svg").read_text()
    assert "TTFT (ms) CDF" in svg  # text kept as text (svg.fonttype none)
    assert (tmp_path / f"{stem}.timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Saved {tmp_path / stem}.latency.png" in capsys.readouterr().out


def test_sim_plot_writes_the_figures(tmp_path):
    assert main([*SIM, "--plot", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"sim.{name}.{fmt}" for name in ("latency", "timeline") for fmt in ("html", "png", "svg")]


def _sweep_rows() -> pd.DataFrame:
    rows = []
    for block in (8, 16, 32):
        for seqs in (32, 64):
            for seed in (0, 1):
                rows.append({"status": "ok", "param.block_size": block,
                             "param.max_num_seqs": seqs, "param.num_prompts": 10,
                             "output_throughput": block * 10.0 + seqs + seed})
    rows.append({"status": "failed", "param.block_size": 8, "param.max_num_seqs": 32,
                 "param.num_prompts": 10, "output_throughput": None})
    return pd.DataFrame(rows)


def test_a_sweep_draws_each_metric_against_its_settings():
    sweep = SweepData("grid", _sweep_rows())
    figures = {f.name: f for _, f in figures_of([sweep], metrics=["output_throughput"])}
    lines = figures["sweep"].panels[0]
    assert lines.x_label == "block_size"
    by_seqs = {series.name: series.y for series in lines.series}
    assert by_seqs["max_num_seqs=64"] == pytest.approx([144.5, 224.5, 384.5])
    heat = figures["sweep-heatmap"].panels[0].heat
    assert heat.x == ["8", "16", "32"] and heat.y == ["32", "64"]
    assert heat.z == [[112.5, 192.5, 352.5], [144.5, 224.5, 384.5]]


def test_a_sweep_of_one_setting_keeps_its_grid_order():
    rows = pd.DataFrame({"status": "ok", "param.kv_tiers": ["none", "host:64GiB", "host:1TiB"],
                         "request_goodput": [0.46, 0.48, 0.78]})
    [(_, figure)] = figures_of([SweepData("tiers", rows)], metrics=["request_goodput"])
    [series] = figure.panels[0].series
    assert series.x == ["none", "host:64GiB", "host:1TiB"]
    assert series.y == pytest.approx([0.46, 0.48, 0.78])


def test_a_sweep_written_by_kvlab_sweep_is_plotted(tmp_path):
    rows = tmp_path / "rows.parquet"
    assert main(["sweep", "--grid", "block_size=8,32", "--grid", "max_num_seqs=16,64",
                 "--num-prompts", "20", "-o", str(rows)]) == 0
    assert main(["plot", str(rows), "-o", str(tmp_path / "fig"), "--format", "svg"]) == 0
    assert (tmp_path / "fig" / "rows.sweep-heatmap.svg").exists()
    sweep = load_results([rows])[0]
    heat = figures_of([sweep], metrics=["kv_token_state_perc"])[1][1].panels[0].heat
    table = sweep.rows.pivot_table(index="param.max_num_seqs", columns="param.block_size",
                                   values="kv_token_state_perc")
    assert np.array(heat.z) == pytest.approx(table.to_numpy())


def test_a_validation_draws_its_errors(tmp_path):
    metrics = {"mean_ttft_ms": {"sim": 11.0, "engine": 10.0, "rel_error": 0.1},
               "output_throughput": {"sim": 90.0, "engine": 100.0, "rel_error": -0.1},
               "num_swaps_in": {"sim": 0.0, "engine": None, "rel_error": None}}
    document = {"metrics": metrics, "reference": "engine", "sim": {}, "engine": {},
                "windows": [{"metrics": metrics}, {"metrics": metrics}]}
    path = tmp_path / "validate-1.json"
    path.write_text(json.dumps(document))
    [validation] = load_results([path])
    assert isinstance(validation, ValidationData)
    [(_, figure)] = figures_of([validation])
    errors = figure.panels[0].series[0]
    assert dict(zip(errors.x, errors.y, strict=True)) == pytest.approx(
        {"mean_ttft_ms": 10.0, "output_throughput": -10.0})
    latency = _panel(figure, "Latency (ms)")
    assert [s.y for s in latency.series] == [[11.0], [10.0]]
    windows = _panel(figure, "Relative error per window")
    assert {s.name: s.y for s in windows.series}["mean_ttft_ms"] == pytest.approx([10.0, 10.0])
    assert main(["plot", str(path), "-o", str(tmp_path), "--format", "html,png"]) == 0
    assert (tmp_path / "validate-1.validation.png").exists()


@pytest.mark.parametrize("args, message", [
    (["missing.json"], "missing.json: no such file or folder"),
    (["--format", "gif", "X"], "figure format 'gif' is not one of html, png, svg"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, message, saved):
    args = [str(saved[0]) if a == "X" else a for a in args]
    assert main(["plot", *args, "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_table_or_other_json_is_refused(tmp_path, saved, capsys):
    table = next(saved[0].parent.glob("*.steps.csv"))
    assert main(["plot", str(table)]) == 2
    assert "a table, not a result" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    assert main(["plot", str(other)]) == 2
    assert "not a kvlab result" in capsys.readouterr().err
    sweep_dir = tmp_path / "rows"
    _sweep_rows().to_parquet(tmp_path / "rows.parquet")
    assert main(["plot", str(tmp_path / "rows.parquet"), "--keys", "nope",
                 "-o", str(sweep_dir)]) == 2
    assert "--keys 'nope' is not a setting" in capsys.readouterr().err


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=400),
       st.integers(2, 50))
def test_binned_max_keeps_the_peak_and_the_bound(values, points):
    x = np.arange(len(values), dtype=float)
    y = np.array(values)
    bx, by = binned_max(x, y, points)
    assert len(bx) <= max(points, 1) or len(bx) == len(values)
    assert max(by) == y.max()
    assert set(bx) <= set(x.tolist())


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300),
       st.integers(2, 100))
def test_cdf_points_rise_to_100(values, points):
    x, y = cdf_points(np.array(values), points)
    assert x == sorted(x) and y == sorted(y)
    assert y[-1] == pytest.approx(100.0)
    assert x[0] == min(values) and x[-1] == max(values)
