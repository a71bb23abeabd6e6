"""The `kvlab` command: a thin shell over library functions.

Subcommands live in `kvlab.cli.commands.<name>` and are imported only when chosen, so `kvlab --help`
does not import numpy, simpy or torch. Each command module has `add_arguments(parser)` and
`run(args) -> int`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from typing import NoReturn, TextIO

from kvlab import __version__
from kvlab.errors import KvlabError, KvlabWarning

# name -> (module under kvlab.cli.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("sim", "simulate a trace through a memory policy on a model and hardware preset"),
    "run": ("run", "run a trace through the real paged engine (cpu, cuda or npu)"),
    "calibrate": ("calibrate", "fit the simulator's cost model to engine step profiles or to a "
                  "server's benchmark (--from-bench)"),
    "validate": ("validate", "run one trace through the engine (or a server: --base-url) and "
                 "the simulator and compare metrics"),
    "serve": ("serve", "serve the real engine over an OpenAI-compatible HTTP API"),
    "bench": ("bench", "benchmark an OpenAI-compatible server: kvlab bench serve --base-url URL"),
    "export-model": ("export_model", "write a tiny preset as a Hugging Face model folder"),
    "policies": ("policies", "list every registered memory policy"),
    "accuracy": ("accuracy", "what a KV-cache precision costs a model: logit KL, top-1 agreement, "
                 "perplexity, greedy agreement against its full-precision cache"),
    "capacity": ("capacity", "KV tokens, pages and concurrency of a model on a device, per "
                 "block size"),
    "presets": ("presets", "list model and hardware presets with their key figures"),
    "sweep": ("sweep", "simulate a grid of settings (local pool or Ray) into a Parquet dataset"),
    "tune": ("tune", "the highest request rate each configuration serves within SLOs"),
    "traces": ("traces", "inspect request traces (kvlab traces info PATH)"),
    "plot": ("plot", "figures of saved results (runs, comparisons, sweeps, validations) as "
             "HTML, PNG and SVG"),
    "dashboard": ("dashboard", "start the Streamlit policy explorer on localhost"),
}


def _top_parser(commands: dict[str, tuple[str, str]]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvlab",
        description="KV-cache memory-management laboratory: simulate, run and validate policies.",
    )
    parser.add_argument("--version", action="version", version=f"kvlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in commands.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _available_commands() -> dict[str, tuple[str, str]]:
    """The commands whose module is installed (a command lands with its library)."""
    found = {}
    for name, entry in COMMANDS.items():
        if importlib.util.find_spec(f"kvlab.cli.commands.{entry[0]}") is not None:
            found[name] = entry
    return found


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `kvlab` console script; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _available_commands()
    if not argv or argv[0] not in commands:
        parser = _top_parser(commands)
        if argv and not argv[0].startswith("-"):
            parser.error(f"unknown command {argv[0]!r}; choose from: {', '.join(commands)}")
        parser.parse_args(argv)
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(f"kvlab.cli.commands.{commands[name][0]}")
    parser = CommandParser(prog=f"kvlab {name}", description=commands[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    import warnings

    shown = warnings.showwarning
    warnings.showwarning = _one_line_warnings(name, shown)
    try:
        return int(module.run(args) or 0)
    except KvlabError as err:
        print(f"kvlab {name}: error: {in_flags(err, parser)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kvlab {name}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown


# vLLM's flags that kvlab does not take, with kvlab's way to the same thing (or why it does not
# apply): said in the one line of the error, instead of a usage dump.
VLLM_FLAGS = {
    "--kv-offloading-size": "a host tier below the device: --kv-tiers host:SIZE (e.g. "
                            "host:64GiB; --kv-offloading-size counts GiB)",
    "--kv-offloading-backend": "memory tiers are kvlab's own: --kv-tiers host:SIZE",
    "--pipeline-parallel-size": "kvlab models one pipeline stage; --tensor-parallel-size "
                                "splits a model over devices (sim)",
    "--trust-remote-code": "not needed: kvlab reads config.json and safetensors itself",
    "--disable-log-requests": "kvlab does not log requests",
    "--disable-log-stats": "kvlab does not log stats",
    "--enforce-eager": "the engine has no CUDA graphs to turn off",
    "--dtype": "the simulator takes the model preset's dtype; --kv-cache-dtype sets the cache's",
}


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser whose errors are one line, as kvlab's own are (not argparse's
    usage dump): a vLLM flag kvlab lacks names kvlab's way to the same thing, another
    unknown flag the nearest known one."""

    def error(self, message: str) -> NoReturn:
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [word.split("=")[0] for word in unknown.group(1).split()
                     if word.startswith("--")]
            message = "; ".join(self._explain(flag) for flag in flags) or message
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _explain(self, flag: str) -> str:
        if flag in VLLM_FLAGS:
            return f"{flag} is vLLM's, not kvlab's: {VLLM_FLAGS[flag]}"
        known = [o for action in self._actions for o in action.option_strings]
        near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        return f"unknown flag {flag}" + (f"; did you mean {near[0]}?" if near else "")


def _one_line_warnings(command: str, default: Callable[..., None]) -> Callable[..., None]:
    """A `warnings.showwarning` that prints kvlab's own warnings (KvlabWarning: a trace's
    skipped rows, ...) as one line each, like its errors, not Python's two lines with a source
    excerpt, and hands every other warning to `default`."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if issubclass(category, KvlabWarning):
            print(f"kvlab {command}: warning: {message}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def in_flags(err: KvlabError, parser: argparse.ArgumentParser) -> str:
    """The error's message with each setting it names written as the flag that set it
    (`max_num_seqs` -> `--max-num-seqs`), where the command has such a flag; quoted text (a
    policy spec, a file name) is left as it is."""
    # the first long name: `-o/--output` is --output, `--kv-cache-memory` before vLLM's alias
    flags = {action.dest: next((o for o in action.option_strings if o.startswith("--")),
                               action.option_strings[-1])
             for action in _actions(parser) if action.option_strings}
    names = [name for name in err.parameters if name in flags]
    if not names:
        return str(err)
    pattern = re.compile(
        r"('[^']*')|(?<![\w-])(" + "|".join(map(re.escape, names)) + r")(?![\w-])"
    )
    return pattern.sub(lambda m: m.group(1) or flags[m.group(2)], str(err))


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions and those of its actions' subcommands (`kvlab traces info`'s)."""
    found = list(parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_actions(sub))
    return found

