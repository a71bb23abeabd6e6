"""Host swap space: the host pages that hold the KV of swapped-out sequences."""

from __future__ import annotations

from collections import deque


class HostPool:
    """A bounded pool of host pages, handed out in FIFO order (deterministic), and which
    sequence's KV each swapped sequence keeps there: its host pages and its token count."""

    __slots__ = ("_free", "_held", "_swapped", "num_total_pages")

    def __init__(self, num_pages: int) -> None:
        self.num_total_pages = num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._held: list[int] = []  # released, but read later in this step (`free_held`)
        self._swapped: dict[int, tuple[list[int], int]] = {}  # request -> (host pages, tokens)

    @property
    def num_used_pages(self) -> int:
        """Host pages holding swapped KV (or read by a swap-in later in this step)."""
        return self.num_total_pages - len(self._free)

    def can_store(self, num_pages: int) -> bool:
        """Whether `num_pages` host pages are free."""
        return num_pages <= len(self._free)

    def store(self, request_id: int, num_pages: int, num_tokens: int) -> list[int]:
        """Take `num_pages` host pages for the request's `num_tokens` tokens (call can_store
        first); returns them in token order."""
        assert request_id not in self._swapped, "swapped out twice"
        free = self._free
        pages = [free.popleft() for _ in range(num_pages)]
        self._swapped[request_id] = (pages, num_tokens)
        return pages

    def holds(self, request_id: int) -> bool:
        """True while the request's KV is here."""
        return request_id in self._swapped

    def stored(self, request_id: int) -> tuple[list[int], int] | None:
        """The request's host pages and token count, or None."""
        return self._swapped.get(request_id)

    def release(self, request_id: int, *, hold: bool = False) -> None:
        """Free the request's host pages (nothing when it holds none). `hold`: not before
        `free_held()` (a swap-in's pages are read later in its step: a swap-out of the same
        step, which runs first, must not take them)."""
        stored = self._swapped.pop(request_id, None)
        if stored is not None:
            (self._held if hold else self._free).extend(stored[0])

    def free_held(self) -> None:
        """Free the pages released with `hold` (the step that reads them is over)."""
        if self._held:
            self._free.extend(self._held)
            self._held = []
