"""kvlab.cli: the `kvlab` command, a thin shell over the library (the top layer).

`kvlab.cli.dispatch` parses the command line and runs the chosen subcommand; each subcommand is a
module of `kvlab.cli.commands`; `report` and `validation_report` print their results.
"""

from kvlab.cli.dispatch import main

__all__ = ["main"]
