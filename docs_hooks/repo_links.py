"""MkDocs hook: a link from a page to a file of the repository outside docs/ (a script, a test,
a source file) works where the Markdown is read in the repository, but not on the site, which
holds only docs/; on the site it becomes the path in code. Links between pages are left to
MkDocs, whose strict build checks them."""

from __future__ import annotations

import posixpath
import re
from typing import Any

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def outside_docs(target: str, page_path: str) -> bool:
    """Whether a relative link `target` from the page at `page_path` (relative to docs/)
    leaves docs/."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return False
    path = target.split("#", 1)[0]
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_path), path))
    return joined == ".." or joined.startswith("../")


def _repl(page_path: str) -> Any:
    def replace(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if not outside_docs(target, page_path):
            return match.group(0)
        path = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_path),
                                                 target.split("#", 1)[0]))
        return text if path in text else f"{text} (`{path}`)"

    return replace


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The page's Markdown with links out of docs/ written as paths."""
    return LINK.sub(_repl(page.file.src_uri), markdown)
