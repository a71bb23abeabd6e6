"""Drawing a `Figure` with matplotlib as PNG or SVG, without a browser (plotly's kaleido needs
Chrome): the images the documentation embeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvlab.errors import KvlabError, writing
from kvlab.plots.model import Figure, Panel

PANEL_SIZE = (5.2, 3.4)  # inches per panel
DPI = 110


def _bars(axes: Any, panel: Panel) -> None:
    count = len(panel.series)
    width = 0.8 / max(count, 1)
    for index, series in enumerate(panel.series):
        positions = np.arange(len(series.x)) + (index - (count - 1) / 2) * width
        if panel.kind == "barh":
            axes.barh(positions, series.y, height=width, label=series.name)
        else:
            axes.bar(positions, series.y, width=width, label=series.name)
    labels = [str(x) for x in panel.series[0].x] if panel.series else []
    ticks = np.arange(len(labels))
    if panel.kind == "barh":
        axes.set_yticks(ticks, labels, fontsize=8)
        axes.axvline(0.0, color="black", linewidth=0.6)
    else:
        axes.set_xticks(ticks, labels, rotation=30 if len(labels) > 3 else 0, ha="right"
                        if len(labels) > 3 else "center", fontsize=8)


def _heat(axes: Any, panel: Panel) -> None:
    heat = panel.heat
    assert heat is not None
    z = np.array([[np.nan if v is None else v for v in row] for row in heat.z], dtype=float)
    image = axes.imshow(z, origin="lower", aspect="auto", cmap="viridis")
    axes.set_xticks(np.arange(len(heat.x)), heat.x, fontsize=8)
    _rotate_long_labels(axes, heat.x)
    axes.set_yticks(np.arange(len(heat.y)), heat.y, fontsize=8)
    for (i, j), value in np.ndenumerate(z):
        if np.isfinite(value):
            axes.text(j, i, f"{value:.4g}", ha="center", va="center", fontsize=7,
                      color="white" if value < np.nanmean(z) else "black")
    axes.figure.colorbar(image, ax=axes)


def _rotate_long_labels(axes: Any, x: list) -> None:
    """Category names that would run into each other are slanted."""
    labels = [value for value in x if isinstance(value, str)]
    if labels and sum(len(label) for label in labels) > 40:
        axes.tick_params(axis="x", labelrotation=30, labelsize=8)
        for label in axes.get_xticklabels():
            label.set_horizontalalignment("right")


def _draw(axes: Any, panel: Panel) -> None:
    if panel.kind == "heatmap":
        _heat(axes, panel)
    elif panel.kind in ("bar", "barh"):
        _bars(axes, panel)
    else:
        for series in panel.series:
            if panel.kind == "step":
                axes.step(series.x, series.y, where="post", label=series.name)
            else:
                axes.plot(series.x, series.y, label=series.name,
                          marker="o" if len(series.x) <= 30 else None, markersize=3)
        axes.grid(alpha=0.3)
        _rotate_long_labels(axes, panel.series[0].x if panel.series else [])
    axes.set_title(panel.title, fontsize=10)
    axes.set_xlabel(panel.x_label)
    axes.set_ylabel(panel.y_label)
    if len(panel.series) > 1:
        axes.legend(fontsize=7)


def write_static(figure: Figure, path: Path) -> Path:
    """Write `figure` to `path` as PNG or SVG (by its suffix) with matplotlib's Agg backend.
    Raises KvlabError when matplotlib is not installed or the file cannot be written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise KvlabError("PNG and SVG figures need matplotlib: pip install 'kvlab[plot]'"
                         ) from exc
    size = (PANEL_SIZE[0] * figure.columns, PANEL_SIZE[1] * figure.rows + 0.6)
    # svg.hashsalt and no date: the same figure writes the same SVG bytes
    with matplotlib.rc_context({"svg.hashsalt": "kvlab", "svg.fonttype": "none"}):
        fig, grid = plt.subplots(figure.rows, figure.columns, figsize=size, squeeze=False)
        try:
            for index, axes in enumerate(grid.flat):
                if index < len(figure.panels):
                    _draw(axes, figure.panels[index])
                else:
                    axes.set_visible(False)
            fig.suptitle(figure.title)
            fig.tight_layout()
            metadata = {"Date": None} if path.suffix == ".svg" else {}
            with writing(path):
                fig.savefig(path, dpi=DPI, metadata=metadata)
        finally:
            plt.close(fig)
    return path
