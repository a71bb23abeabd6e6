"""Drawing a `Figure` with plotly as one self-contained HTML page: plotly.js is inlined, so the
page works offline and from a file (no CDN)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError, writing
from kvlab.plots.model import Figure, Panel

PANEL_HEIGHT = 320  # pixels per row of panels


def _traces(panel: Panel) -> list[Any]:
    import plotly.graph_objects as go

    if panel.heat is not None:
        heat = panel.heat
        return [go.Heatmap(x=heat.x, y=heat.y, z=heat.z, colorscale="Viridis",
                           texttemplate="%{z:.4g}", name=panel.title, showscale=False)]
    traces = []
    for series in panel.series:
        if panel.kind in ("bar", "barh"):
            horizontal = panel.kind == "barh"
            traces.append(go.Bar(
                x=series.y if horizontal else series.x, y=series.x if horizontal else series.y,
                orientation="h" if horizontal else "v", name=series.name,
                legendgroup=series.name))
        else:
            traces.append(go.Scatter(
                x=series.x, y=series.y, mode="lines" if len(series.x) > 30 else "lines+markers",
                line={"shape": "hv" if panel.kind == "step" else "linear"},
                name=series.name, legendgroup=series.name))
    return traces


def to_plotly(figure: Figure) -> Any:
    """The plotly figure of `figure`: one subplot per panel, legends shared by name."""
    from plotly.subplots import make_subplots

    plot = make_subplots(rows=figure.rows, cols=figure.columns,
                         subplot_titles=[panel.title for panel in figure.panels])
    shown: set[str] = set()
    for index, panel in enumerate(figure.panels):
        row, col = divmod(index, figure.columns)
        for trace in _traces(panel):
            trace.update(showlegend=panel.heat is None and trace.name not in shown)
            shown.add(trace.name)
            plot.add_trace(trace, row=row + 1, col=col + 1)
        plot.update_xaxes(title_text=panel.x_label, row=row + 1, col=col + 1)
        plot.update_yaxes(title_text=panel.y_label, row=row + 1, col=col + 1)
    plot.update_layout(title=figure.title, template="plotly_white", barmode="group",
                       height=PANEL_HEIGHT * figure.rows + 120)
    return plot


def write_html(figure: Figure, path: Path) -> Path:
    """Write `figure` to `path` as one HTML page with plotly.js inlined. Raises KvlabError when
    plotly is not installed or the file cannot be written."""
    try:
        import plotly  # noqa: F401
    except ImportError as exc:
        raise KvlabError("HTML figures need plotly: pip install 'kvlab[plot]'") from exc
    with writing(path):
        to_plotly(figure).write_html(str(path), include_plotlyjs=True, full_html=True)
    return path
