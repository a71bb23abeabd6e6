"""The stdlib corpus: definitions as written, only those identical on every Python, a held-out
split by file, and on Python 3.10-3.13 exactly the corpus the committed model was trained on."""

from __future__ import annotations

import json
import platform

import pytest

from kvlab.engine.models.stdlib_llama import MODEL_DIR
from kvlab.engine.models.stdlib_llama.corpus import (
    CHECKED_PYTHONS,
    MODULE_DOC,
    chat_pair,
    file_segments,
    load_corpus,
    stable_segments,
)

SOURCE = '''"""A module."""

import functools


@functools.cache
def cached(x):
    """Square x, remembering every answer it gave before."""
    return x * x


def twice():
    pass


def twice():
    pass


class Point:
    """A point in the plane, with an x and a y coordinate."""
'''


def _stdlib(tmp_path, name, source):
    root = tmp_path / name
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text(source, encoding="utf-8")
    (root / "test").mkdir()
    (root / "test" / "test_mod.py").write_text(source, encoding="utf-8")
    return root


def test_a_file_gives_its_docstring_and_definitions_with_decorators(tmp_path):
    segments = file_segments(_stdlib(tmp_path, "a", SOURCE), "pkg/mod.py")
    assert list(segments) == [MODULE_DOC, "cached", "Point"]  # `twice` is defined twice
    assert segments["cached"].text.startswith("@functools.cache\ndef cached(x):")
    assert segments["cached"].module == "pkg.mod"


def test_only_definitions_identical_everywhere_are_kept(tmp_path):
    changed = SOURCE.replace("return x * x", "return x ** 2")
    roots = [_stdlib(tmp_path, "a", SOURCE), _stdlib(tmp_path, "b", changed)]
    kept = stable_segments(roots)
    assert [s.name for s in kept] == [MODULE_DOC, "Point"]  # test/ is never read
    assert all(s.path == "pkg/mod.py" for s in kept)


def test_docstrings_make_chat_pairs(tmp_path):
    segments = file_segments(_stdlib(tmp_path, "a", SOURCE), "pkg/mod.py")
    assert chat_pair(segments["cached"]) == (
        "What does pkg.mod.cached do?", "Square x, remembering every answer it gave before.")
    assert chat_pair(segments["Point"]) == (
        "What is pkg.mod.Point?", "A point in the plane, with an x and a y coordinate.")
    assert chat_pair(segments[MODULE_DOC]) is None


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_held_out_files_are_never_trained_on(corpus):
    train = {s.path for s in corpus.split(held_out=False)}
    held_out = {s.path for s in corpus.split(held_out=True)}
    assert train and held_out and not train & held_out


@pytest.mark.skipif(platform.python_version() not in CHECKED_PYTHONS,
                    reason="the corpus was checked identical on " + ", ".join(CHECKED_PYTHONS))
def test_this_python_reads_the_committed_corpus(corpus):
    record = json.loads((MODEL_DIR / "training.json").read_text(encoding="utf-8"))
    assert corpus.num_missing == 0
    assert corpus.sha256 == record["corpus"]["sha256"]
