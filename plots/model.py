"""What a figure shows, independent of how it is drawn: panels of series or a heat map.

The builders (`kvlab.plots.runs`, `.sweeps`, `.validation`) turn result files into `Figure`s;
the renderers (`kvlab.plots.html`, `.static`) draw the same `Figure` with plotly (a
self-contained HTML page) and with matplotlib (PNG, SVG), so both show the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a panel draws its series: lines (time series), steps (CDFs), grouped vertical bars,
# horizontal bars, or a heat map.
PANEL_KINDS = ("line", "step", "bar", "barh", "heatmap")


@dataclass(frozen=True, slots=True)
class Series:
    """One named line or group of bars: x values (numbers or category names) and y values."""

    name: str
    x: list
    y: list


@dataclass(frozen=True, slots=True)
class Heat:
    """A heat map's cells: `z[i][j]` is the value at column `x[j]` and row `y[i]` (None: no
    run had those settings)."""

    x: list[str]
    y: list[str]
    z: list[list[float | None]]


@dataclass(frozen=True, slots=True)
class Panel:
    """One set of axes: its title, axis labels, kind (PANEL_KINDS) and what it draws."""

    title: str
    x_label: str
    y_label: str
    kind: str = "line"
    series: tuple[Series, ...] = ()
    heat: Heat | None = None

    def __post_init__(self) -> None:
        if self.kind not in PANEL_KINDS:
            raise ValueError(f"panel kind {self.kind!r} is not one of {PANEL_KINDS}")


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure file: `name` is the file name's last part (`<stem>.<name>.png`), the panels
    are laid out `columns` to a row."""

    name: str
    title: str
    panels: tuple[Panel, ...]
    columns: int = 1

    @property
    def rows(self) -> int:
        """Rows of panels in the layout."""
        return -(-len(self.panels) // self.columns)
