"""Figures of kvlab's results (`kvlab plot`, `kvlab sim --plot DIR`): a run's memory and queues
over time and latency CDFs, several runs compared, a sweep's metrics against its settings (a
heat map for two) and a validation's errors, each written as a self-contained HTML page
(plotly, inlined) and as PNG/SVG images (matplotlib, no browser).

`load_results` reads the files the CLI saves; `figures_of` turns results into `Figure`s (what
is drawn, as data); `write_figures` draws them; `plot_results` does all three.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.plots.html import write_html
from kvlab.plots.load import Result, RunData, SweepData, ValidationData, load_results
from kvlab.plots.model import Figure, Heat, Panel, Series
from kvlab.plots.runs import run_figures
from kvlab.plots.static import write_static
from kvlab.plots.sweeps import sweep_figures
from kvlab.plots.validation import validation_figures

__all__ = [
    "FORMATS",
    "Figure",
    "Heat",
    "Panel",
    "Result",
    "RunData",
    "Series",
    "SweepData",
    "ValidationData",
    "figures_of",
    "load_results",
    "plot_results",
    "write_figures",
]

FORMATS = ("html", "png", "svg")


def figures_of(results: list[Result], *, metrics: list[str] | None = None,
               keys: list[str] | None = None) -> list[tuple[str, Figure]]:
    """(file stem, figure) for every figure of `results`: one run's own figures, several
    runs compared (stem `compare`), each sweep's (`metrics` against `keys`, defaults: the
    settings varied) and each validation's."""
    runs = _distinct_labels([result for result in results if isinstance(result, RunData)])
    figures: list[tuple[str, Figure]] = []
    if runs:
        stem = runs[0].stem if len(runs) == 1 else "compare"
        figures += [(stem, figure) for figure in run_figures(runs)]
    for result in results:
        if isinstance(result, SweepData):
            figures += [(result.label, f) for f in sweep_figures(result, metrics, keys)]
        elif isinstance(result, ValidationData):
            figures += [(result.label, f) for f in validation_figures(result)]
    return figures


def _distinct_labels(runs: list[RunData]) -> list[RunData]:
    """The runs, each labelled apart from the others: a label two runs share gets `[i]`."""
    labels = [run.label for run in runs]
    return [run if labels.count(run.label) == 1 else replace(run, label=f"{run.label} [{i + 1}]")
            for i, run in enumerate(runs)]


def write_figures(figures: list[tuple[str, Figure]], out_dir: str | Path,
                  formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write each figure as `<out_dir>/<stem>.<figure name>.<format>` for each format (html,
    png, svg); creates `out_dir`. Returns the paths written."""
    unknown = [fmt for fmt in formats if fmt not in FORMATS]
    if unknown:
        raise KvlabError(f"figure format {unknown[0]!r} is not one of {', '.join(FORMATS)}")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvlabError(f"cannot create {out}: {exc.strerror or exc}") from exc
    paths = []
    for stem, figure in figures:
        for fmt in formats:
            path = out / f"{stem}.{figure.name}.{fmt}"
            paths.append(write_html(figure, path) if fmt == "html"
                         else write_static(figure, path))
    return paths


def plot_results(results: list[Result], out_dir: str | Path, *,
                 formats: tuple[str, ...] = FORMATS, metrics: list[str] | None = None,
                 keys: list[str] | None = None) -> list[Path]:
    """Write the figures of `results` (see `figures_of`) into `out_dir`; the paths written.
    Raises KvlabError when there is nothing to draw."""
    figures = figures_of(results, metrics=metrics, keys=keys)
    if not figures:
        raise KvlabError("nothing to plot: the results have no step or request tables, "
                         "sweep rows or validation metrics (save runs with --save-result)")
    return write_figures(figures, out_dir, formats)
