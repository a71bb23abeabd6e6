"""Dashboard widgets made from the table of settings (kvlab.sweep.settings): a widget's default
and help are its setting's, declared once with the CLI flag and the sweep setting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvlab.sweep.settings import SETTINGS


def setting_help(name: str) -> str:
    """The help of setting `name`, as its flag shows it."""
    return SETTINGS[name].help_text()


def number_setting(container: Any, name: str, low: float, high: float, *, key: str,
                   label: str | None = None, default: float | None = None) -> Any:
    """A number input for setting `name` between `low` and `high`, at the setting's default
    (`default` where the setting's is None: the dashboard's 0 for unset)."""
    value = SETTINGS[name].default if default is None else default
    return container.number_input(label or name, low, high, value, key=key,
                                  help=setting_help(name))


def choice_setting(container: Any, name: str, options: Sequence[str], *, key: str,
                   label: str | None = None, default: str | None = None) -> Any:
    """A select box for setting `name` over `options`, at the setting's default (`default`
    where the setting's is None: a library default that depends on more than the flag)."""
    default = SETTINGS[name].default if default is None else default
    index = list(options).index(default) if default in options else 0
    return container.selectbox(label or name, list(options), index=index, key=key,
                               help=setting_help(name))


def switch_setting(container: Any, name: str, *, key: str, default: bool | None = None) -> Any:
    """A checkbox for setting `name` (unset: `default`, else the setting's, else off)."""
    value = SETTINGS[name].default if default is None else default
    return container.checkbox(name, bool(value), key=key, help=setting_help(name))
