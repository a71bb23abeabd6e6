"""Every flag of every command explains itself (issue 15 #9): a help text, and the default it
runs with when there is one (argparse does not print defaults unless told)."""

from __future__ import annotations

import argparse
import importlib

import pytest

from kvlab.cli.dispatch import COMMANDS, main


def _parsers():
    for name, (module_name, _) in COMMANDS.items():
        module = importlib.import_module(f"kvlab.cli.commands.{module_name}")
        parser = argparse.ArgumentParser(prog=f"kvlab {name}")
        module.add_arguments(parser)
        stack = [(name, parser)]
        while stack:
            label, current = stack.pop()
            for action in current._actions:
                if isinstance(action, argparse._SubParsersAction):
                    stack += [(f"{label} {sub}", p) for sub, p in action.choices.items()]
            yield label, current


def _flags():
    for label, parser in _parsers():
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help", "version"):
                yield pytest.param(action, id=f"{label} {action.option_strings[0]}")


@pytest.mark.parametrize("action", list(_flags()))
def test_a_flag_has_help_and_states_its_default(action):
    assert action.help, "no help text"
    silent = (None, False, argparse.SUPPRESS)
    if action.default not in silent and action.nargs != 0:
        assert "default" in action.help, f"default {action.default!r} not stated"


def test_validate_states_its_own_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "requests of each validated window (default 8)" in text
    assert "cpu (default here" in text
    assert "write the validation report as JSON" in text  # not run's tables, which it lacks
    assert "(default validate-<date>.json)" in text
