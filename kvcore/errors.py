"""The one exception type for user mistakes; the CLI prints it as one line and exits with 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class KvlabError(Exception):
    """A user mistake (bad setting, file, trace row, preset, policy) with an actionable message.

    Library layers word it in their own terms: `parameters` names the settings the message
    speaks of (e.g. "max_num_seqs", as the message writes them), and the CLI shows each as the
    flag that set it (`--max-num-seqs`).
    """

    def __init__(self, message: str, *, parameters: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.parameters = parameters

    def __reduce__(self) -> tuple:  # keep `parameters` across processes (pools, Ray)
        return (_rebuild, (str(self), self.parameters))


def _rebuild(message: str, parameters: tuple[str, ...]) -> KvlabError:
    return KvlabError(message, parameters=parameters)


class KvlabWarning(UserWarning):
    """Something a user should know that does not stop the run (rows skipped, fewer requests
    than asked); the CLI prints it as one line."""


@contextmanager
def writing(path: str | Path, what: str = "") -> Iterator[None]:
    """An OSError inside (a folder that cannot be made, a full disk, no permission) becomes a
    KvlabError naming `path`, and `what` it holds where given ("cannot write the cost model
    PATH: ...")."""
    try:
        yield
    except OSError as exc:
        raise KvlabError(f"cannot write {what + ' ' if what else ''}{path}: "
                         f"{exc.strerror or exc}") from exc


def write_text_file(path: Path, text: str, what: str = "") -> Path:
    """Write `text` to `path`, its folders made first (`writing`'s error otherwise)."""
    with writing(path, what):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path
