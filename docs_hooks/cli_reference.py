"""MkDocs hook: the CLI reference page (reference/cli.md), generated at build time from the
`kvlab` parsers themselves, so it cannot fall behind the flags."""

from __future__ import annotations

import argparse
import importlib
import os
from typing import Any

HELP_WIDTH = "100"  # argparse wraps help text to $COLUMNS


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _section(name: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `kvlab {name}`", "", "```text", parser.format_help().rstrip(),
             "```", ""]
    for sub_name, sub in _subcommands(parser):
        lines += _section(f"{name} {sub_name}", sub, level + 1)
    return lines


def cli_reference() -> str:
    """The page: `kvlab --help`, then each command's `--help` (and its subcommands')."""
    from kvlab.cli.dispatch import COMMANDS, CommandParser, _available_commands, _top_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        lines = ["# CLI reference", "",
                 "Generated from the `kvlab` parsers when the site is built "
                 "(`docs_hooks/cli_reference.py`): the same text as `kvlab COMMAND --help`.", "",
                 "```text", _top_parser(_available_commands()).format_help().rstrip(), "```", ""]
        for name, (module_name, help_text) in COMMANDS.items():
            module = importlib.import_module(f"kvlab.cli.commands.{module_name}")
            parser = CommandParser(prog=f"kvlab {name}", description=help_text)
            module.add_arguments(parser)
            lines += _section(name, parser, 2)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(lines) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference/cli.md to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "reference/cli.md", content=cli_reference()))
    return files
