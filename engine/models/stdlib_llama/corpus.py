"""The training text of stdlib-llama: the Python standard library's own source, read offline.

The corpus is a fixed list of top-level definitions (functions, classes, module docstrings)
whose source text is byte-identical in CPython 3.10.13, 3.11.2, 3.11.7, 3.12.1 and 3.13.0,
listed with a hash each in corpus_manifest.tsv. Any of those Pythons (and most other 3.10-3.13
patch releases) reads the same corpus from its own stdlib; a definition that differs on the
running Python is left out and counted, so the corpus hash then says it is not the committed
one. Whole files differ too often to be the unit: 3.11.2 and 3.11.7 already disagree on half
their bytes.

Held out: every definition of the files whose path hashes to 0 modulo HELD_OUT_EVERY, so the
held-out perplexity is measured on modules the model never saw.

`python -m kvlab.engine.models.stdlib_llama.corpus STDLIB_DIR...` rewrites the manifest from
the stdlib folders of several Pythons (how the committed one was made).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import sys
import sysconfig
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvlab.errors import KvlabError

MANIFEST = Path(__file__).resolve().with_name("corpus_manifest.tsv")
HELD_OUT_EVERY = 10
# The CPython builds the manifest was made from (python -m ...corpus with their stdlib folders).
CHECKED_PYTHONS = ("3.10.13", "3.11.2", "3.11.7", "3.12.1", "3.13.0")
MODULE_DOC = "__doc__"  # the name of a module docstring's segment
# Folders of the stdlib that are not its library text: tests, GUI demos, installers, codec
# tables (generated), documentation data, third-party packages.
SKIPPED_FOLDERS = frozenset({
    "site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "tkinter",
    "turtledemo", "ensurepip", "encodings", "pydoc_data", "__phello__", "venv",
})
# A chat answer is the first paragraph of a docstring of this many characters.
MIN_ANSWER_CHARS, MAX_ANSWER_CHARS = 24, 480


@dataclass(frozen=True, slots=True)
class Segment:
    """One top-level definition (or module docstring) of one stdlib file, as written."""

    path: str  # relative to the stdlib folder, '/'-separated
    name: str  # the def/class name, or MODULE_DOC
    text: str

    @property
    def sha(self) -> str:
        """The manifest's hash of the text (16 hex digits of its SHA-256)."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]

    @property
    def module(self) -> str:
        """The dotted module name (`json`, `email.utils`)."""
        parts = self.path.removesuffix(".py").split("/")
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    @property
    def held_out(self) -> bool:
        """True for the definitions of held-out files."""
        return int(hashlib.sha256(self.path.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


@dataclass(frozen=True, slots=True)
class Corpus:
    """The segments the running Python has of the manifest, and how many it lacks."""

    segments: tuple[Segment, ...]
    num_missing: int

    @property
    def sha256(self) -> str:
        """SHA-256 of every segment's path, name and text in manifest order."""
        digest = hashlib.sha256()
        for segment in self.segments:
            digest.update(f"{segment.path}\0{segment.name}\0{segment.text}\0".encode())
        return digest.hexdigest()

    def split(self, held_out: bool) -> list[Segment]:
        """The training segments (held_out False) or the held-out ones."""
        return [s for s in self.segments if s.held_out == held_out]


def stdlib_dir() -> Path:
    """The running Python's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def library_files(root: Path) -> list[str]:
    """The stdlib's library source files under `root`, relative and sorted."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if SKIPPED_FOLDERS.isdisjoint(rel.parts[:-1]):
            files.append(rel.as_posix())
    return sorted(files)


def file_segments(root: Path, rel: str) -> dict[str, Segment]:
    """A file's module docstring and top-level defs and classes (decorators included), by name;
    names defined twice, and files this Python cannot read or parse, give none."""
    try:
        source = (root / rel).read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old sources
            tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return {}
    lines = source.splitlines(keepends=True)
    found: dict[str, list[str]] = {}
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            name = MODULE_DOC
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        else:
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        end = node.end_lineno or node.lineno
        found.setdefault(name, []).append("".join(lines[start - 1:end]))
    return {
        name: Segment(rel, name, texts[0]) for name, texts in found.items() if len(texts) == 1
    }


def stable_segments(roots: Sequence[Path]) -> list[Segment]:
    """The segments of roots[0] whose text is identical under every root, in file order."""
    stable = []
    for rel in library_files(roots[0]):
        first = file_segments(roots[0], rel)
        others = [file_segments(root, rel) for root in roots[1:]]
        stable += [
            segment for name, segment in first.items()
            if all(name in other and other[name].text == segment.text for other in others)
        ]
    return stable


def write_manifest(segments: Sequence[Segment], path: Path = MANIFEST) -> None:
    """One `path<TAB>name<TAB>sha` line a segment."""
    lines = [f"{s.path}\t{s.name}\t{s.sha}\n" for s in segments]
    path.write_text("".join(lines), encoding="utf-8")


def read_manifest(path: Path = MANIFEST) -> list[tuple[str, str, str]]:
    """The manifest's (path, name, sha) rows in order."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if len(fields) != 3:
            raise KvlabError(f"line {number} of {path}: expected path, name and sha by tabs")
        rows.append((fields[0], fields[1], fields[2]))
    return rows


def load_corpus(root: Path | None = None, manifest: Path = MANIFEST) -> Corpus:
    """The manifest's segments read from `root` (default: the running Python's stdlib)."""
    root = root or stdlib_dir()
    rows = read_manifest(manifest)
    by_file: dict[str, dict[str, Segment]] = {}
    kept = []
    for rel, name, sha in rows:
        if rel not in by_file:
            by_file[rel] = file_segments(root, rel)
        segment = by_file[rel].get(name)
        if segment is not None and segment.sha == sha:
            kept.append(segment)
    return Corpus(tuple(kept), len(rows) - len(kept))


def chat_pair(segment: Segment) -> tuple[str, str] | None:
    """(question, answer) from a definition's docstring: "What does json.dumps do?" (or "What
    is json.JSONDecoder?") and the docstring's first paragraph on one line; None without a
    docstring of a fitting length."""
    if segment.name == MODULE_DOC:
        return None
    node = ast.parse(segment.text).body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    doc = ast.get_docstring(node)
    if not doc:
        return None
    answer = " ".join(doc.split("\n\n")[0].split())
    if not MIN_ANSWER_CHARS <= len(answer) <= MAX_ANSWER_CHARS:
        return None
    qualified = f"{segment.module}.{segment.name}"
    if isinstance(node, ast.ClassDef):
        return f"What is {qualified}?", answer
    return f"What does {qualified} do?", answer


def main(argv: list[str] | None = None) -> int:
    """Rewrite the manifest from several stdlib folders; print what it holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path, metavar="STDLIB_DIR",
                        help="stdlib folders of the Pythons the corpus must be identical on")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    args = parser.parse_args(argv)
    segments = stable_segments(args.roots)
    write_manifest(segments, args.manifest)
    num_chars = sum(len(s.text) for s in segments)
    print(f"{len(segments)} segments, {num_chars} characters, written to {args.manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
