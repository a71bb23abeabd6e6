"""The one exception type for user mistakes; the CLI prints it as one line and exits with 2."""

from __future__ import annotations


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
