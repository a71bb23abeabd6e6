"""The precision mix over time in a run's timeline (plots/precision.py): the share of pages at
each level and the demotions per second, from a saved demoting run's step table."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.cli import main
from kvlab.metrics.precision_mix import level_label
from kvlab.plots import figures_of, load_results
from kvlab.plots.precision import binned_rate, binned_shares

pytest.importorskip("plotly")


@pytest.fixture(scope="module")
def demoting(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    assert main(["sim", "--num-prompts", "120", "--disable-tqdm", "--enable-prefix-caching",
                 "--policy", "paged:eviction=lru,precision=age:recent=64,depth=2",
                 "--save-result", "--result-dir", str(out)]) == 0
    (path,) = out.glob("*.json")
    return load_results([path])[0]


def _timeline(run):
    return _timeline_of([run])


def _timeline_of(runs):
    return dict((f.name, f) for _, f in figures_of(runs))["timeline"]


def test_the_timeline_shows_the_mix_and_the_demotion_rate(demoting):
    panels = {panel.title: panel for panel in _timeline(demoting).panels}
    mix = panels["KV precision mix"].series
    names = demoting.summary["precision_levels"].split("/")
    # (one run: its levels' names, the model's own dtype said so)
    assert [s.name for s in mix] == [level_label(name) for name in names]
    assert mix[0].name == "auto (model dtype)"
    totals = np.nansum([s.y for s in mix], axis=0)
    held = np.isfinite(mix[0].y)
    np.testing.assert_allclose(totals[held], 100.0)
    assert max(mix[2].y) > 50  # most pages reach int4 at some point
    (rate,) = panels["Demotions"].series
    steps = demoting.steps
    demoted = steps["num_demotions_to_level_1"].sum() + steps["num_demotions_to_level_2"].sum()
    widths = np.diff([*rate.x, steps["start_s"].iloc[-1]])
    assert float(np.dot(rate.y, widths)) == pytest.approx(demoted)


def test_the_timeline_kv_usage_is_the_bytes_held_pages_fill(demoting):
    """A demoted page fills part of a page: the usage line is the used pages less those
    demotion spared, over the device's pages (the pool's page ids are more)."""
    panels = {panel.title: panel for panel in _timeline(demoting).panels}
    (usage,) = panels["KV cache usage"].series
    steps = demoting.steps.sort_values("start_s")
    filled = steps["num_used_pages"] - steps["num_spared_pages"]
    assert steps["num_spared_pages"].max() > 0
    expected = 100.0 * filled.to_numpy(dtype=float) / demoting.summary["num_total_pages"]
    assert max(usage.y) == pytest.approx(expected.max())


def test_several_runs_name_their_lines_by_run_and_level(demoting):
    import dataclasses

    other = dataclasses.replace(demoting, label="other")
    panels = {p.title: p for p in _timeline_of([demoting, other]).panels}
    names = demoting.summary["precision_levels"].split("/")
    assert [s.name for s in panels["KV precision mix"].series] == [
        f"{label} {level_label(name)}" for label in (demoting.label, "other")
        for name in names]
    assert [s.name for s in panels["Demotions"].series] == [demoting.label, "other"]


def test_a_run_without_demotion_has_no_precision_panel(demoting, tmp_path):
    assert main(["sim", "--num-prompts", "20", "--disable-tqdm", "--save-result",
                 "--result-dir", str(tmp_path)]) == 0
    run = load_results(list(tmp_path.glob("*.json")))[0]
    assert "KV precision mix" not in [p.title for p in _timeline(run).panels]


@given(st.lists(st.tuples(st.floats(0, 50), st.integers(0, 9), st.integers(0, 9)),
                min_size=1, max_size=300), st.integers(1, 40))
def test_binned_shares_sum_to_100_where_pages_are(rows, points):
    rows.sort()
    x = np.array([r[0] for r in rows])
    parts = [np.array([r[1] for r in rows]), np.array([r[2] for r in rows])]
    bx, (a, b) = binned_shares(x, parts, points)
    assert len(bx) <= max(points, len(rows) if len(rows) <= points else points)
    total = np.array(a) + np.array(b)
    assert np.allclose(total[np.isfinite(total)], 100.0)


@given(st.lists(st.tuples(st.floats(0, 500), st.integers(0, 20)), min_size=1, max_size=300),
       st.integers(1, 60))
def test_binned_rate_keeps_every_count(rows, points):
    rows.sort()
    x = np.array([r[0] for r in rows])
    counts = np.array([r[1] for r in rows])
    starts, rates = binned_rate(x, counts, points)
    span = x[-1] - x[0]
    widths = np.diff([*starts, x[0] + (span or 1.0)])
    assert len(starts) <= points
    assert float(np.dot(rates, widths)) == pytest.approx(counts.sum())
