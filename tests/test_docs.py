"""The README and the documentation site: every `kvlab ...` command they show parses, their
links lead somewhere, the CLI reference is generated from the parsers, and the site builds
with `mkdocs build --strict` (as `make lint` runs it)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.cli.dispatch import COMMANDS, CommandParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md")),
         ROOT / "docs" / "getting-started.md"]


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs_hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shell_blocks(text: str) -> list[str]:
    """The contents of a page's shell code blocks (```bash, ```sh, ```console or no language)."""
    blocks, current, language = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current, language = [], line[3:].strip()
            else:
                if language in ("", "bash", "sh", "console"):
                    blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def kvlab_commands(text: str) -> list[str]:
    """The `kvlab ...` command lines of a page's shell blocks, continuation lines joined,
    comments and a trailing `&` left out."""
    commands = []
    for block in shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            if not re.search(r"(^|[\s/])kvlab ", line):
                continue
            words = shlex.split(line, comments=True)
            if words and words[-1] == "&":
                words = words[:-1]
            for index, word in enumerate(words):
                if word == "kvlab" or word.endswith("/kvlab"):
                    commands.append(shlex.join(words[index + 1:]))
                    break
    return commands


def _parse(command: str) -> None:
    words = shlex.split(command)
    name, rest = words[0], words[1:]
    module = importlib.import_module(f"kvlab.cli.commands.{COMMANDS[name][0]}")
    parser = CommandParser(prog=f"kvlab {name}")
    module.add_arguments(parser)
    parser.parse_args(rest)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_kvlab_command_shown_parses(page, capsys):
    commands = kvlab_commands(page.read_text())
    failed = []
    for command in commands:
        try:
            _parse(command)
        except SystemExit:
            failed.append(f"kvlab {command}: {capsys.readouterr().err.strip()}")
    assert not failed, "\n".join(failed)


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    text = (ROOT / "README.md").read_text()
    lines = [line.split("#")[0].strip() for line in shell_blocks(text)[0].splitlines()[:2]]
    assert lines == ["make run", "make test"]
    assert len(text.splitlines()) < 90
    assert len(kvlab_commands(text)) >= 8  # the tour


def test_readme_links_lead_to_files():
    text = (ROOT / "README.md").read_text()
    assert "FACTS.md" not in text
    for target in re.findall(r"\]\(([^)\s#]+)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_the_cli_reference_has_every_command_and_flag():
    page = _hook("cli_reference").cli_reference()
    for name, (module_name, _) in COMMANDS.items():
        assert f"## `kvlab {name}`" in page
        parser = CommandParser(prog=f"kvlab {name}")
        importlib.import_module(f"kvlab.cli.commands.{module_name}").add_arguments(parser)
        for action in parser._actions:
            for option in action.option_strings:
                assert option in page, (name, option)
    assert "### `kvlab bench serve`" in page  # subcommands too


def test_links_out_of_docs_become_paths():
    hook = _hook("repo_links")
    assert hook.outside_docs("../benchmarks/x.py", "index.md")
    assert hook.outside_docs("../../tests/t.py#L3", "guides/a.md")
    assert not hook.outside_docs("../kv_layout.md", "guides/a.md")
    assert not hook.outside_docs("https://example.org/a", "index.md")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="needs the dev extra")
def test_the_site_builds_strict(tmp_path):
    """`mkdocs build --strict` (make lint runs it too): no broken link, anchor or page."""
    mkdocs = shutil.which("mkdocs") or str(Path(sys.executable).with_name("mkdocs"))
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
