"""Why requests failed, in words that many requests share (the summary's `failed_reasons`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvlab.metrics.run_result import COMPLETED_STATUSES

# A failure message's request-specific parts, so that the same cause counts as one reason.
_REQUEST_ID = re.compile(r"^request \S+ ")
_NEEDS_TOKENS = re.compile(r"needs \d+ tokens \(\d+ prompt \+ \d+ output\), more than "
                           r"(max_model_len \d+)")
_NEEDS_PAGES = re.compile(r"needs \d+ KV pages but the cache has only (\d+) .*")


def failure_reason(status: str, error: str | None) -> str:
    """Why a request failed, in words that many requests share: `needs more than
    max_model_len 4096`, `needs more KV pages than the cache's 1000`, the first sentence of a
    server's message, or the status (aborted, unfinished) when there is no message."""
    if not error:
        return {"finished_aborted": "aborted"}.get(status, f"did not finish ({status})")
    reason = _REQUEST_ID.sub("", error.strip().splitlines()[0])
    reason = _NEEDS_TOKENS.sub(r"needs more tokens than \1", reason)
    reason = _NEEDS_PAGES.sub(r"needs more KV pages than the cache's \1", reason)
    # a server's message: its first sentence names the cause, the next ones this request
    return reason.split(". ")[0].rstrip(".")


def failed_reasons(requests: Sequence[Any]) -> dict[str, int]:
    """{reason: failed requests} over the requests that did not complete, most common first."""
    counts: dict[str, int] = {}
    for request in requests:
        if request.status.value not in COMPLETED_STATUSES:
            reason = failure_reason(request.status.value, request.error)
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
