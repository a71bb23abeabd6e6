"""The one exception type for user mistakes; the CLI prints it as one line and exits with 2."""


class KvlabError(Exception):
    """A user mistake (bad flag, file, trace row, preset, policy) with an actionable message."""
