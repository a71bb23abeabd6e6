"""Contiguous reservation (the pre-PagedAttention baseline): first-fit over the page addresses."""

from __future__ import annotations

import bisect

from kvlab.policies.registry import register


@register(
    "allocation",
    "contiguous",
    help="one contiguous region per request, first-fit (Orca-style; reserve=max|pow2|oracle)",
)
class ContiguousAllocator:
    """Free memory as sorted, merged extents; a block is one run of consecutive pages.

    Freed runs leave holes; a request needing more pages than the largest hole waits even when
    enough pages are free in total: that is external fragmentation.
    """

    __slots__ = ("_lengths", "_starts", "num_free_pages", "num_total_pages")
    free_list = None  # a block is a run of consecutive pages, found first-fit
    reserves_region = True

    def __init__(self, num_total_pages: int) -> None:
        self.num_total_pages = num_total_pages
        self.num_free_pages = num_total_pages
        self._starts: list[int] = [0] if num_total_pages else []
        self._lengths: list[int] = [num_total_pages] if num_total_pages else []

    def pages_for(self, num_pages: int) -> int:
        """Exactly the requested run."""
        return num_pages

    def allocate(self, num_pages: int) -> list[int] | None:
        """The first (lowest-address) hole that fits, or None."""
        for i, length in enumerate(self._lengths):
            if length >= num_pages:
                start = self._starts[i]
                if length == num_pages:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] = start + num_pages
                    self._lengths[i] = length - num_pages
                self.num_free_pages -= num_pages
                return list(range(start, start + num_pages))
        return None

    def can_allocate(self, num_pages: int, extra_free: list[int] = ()) -> bool:  # type: ignore[assignment]
        """Whether some hole, after merging `extra_free` pages in, holds `num_pages`."""
        if any(length >= num_pages for length in self._lengths):
            return True
        if not extra_free:
            return False
        probe = ContiguousAllocator(0)
        probe._starts, probe._lengths = list(self._starts), list(self._lengths)
        probe.release(list(extra_free))
        return any(length >= num_pages for length in probe._lengths)

    def release(self, pages: list[int]) -> None:
        """Return pages and merge them with neighbouring holes."""
        for start, length in _runs(sorted(pages)):
            self._insert(start, length)
            self.num_free_pages += length

    def num_unusable_free_pages(self) -> int:
        """Free pages outside the largest hole."""
        return self.num_free_pages - max(self._lengths, default=0)

    def _insert(self, start: int, length: int) -> None:
        starts, lengths = self._starts, self._lengths
        i = bisect.bisect_left(starts, start)
        if i > 0 and starts[i - 1] + lengths[i - 1] == start:
            i -= 1
            lengths[i] += length
        else:
            starts.insert(i, start)
            lengths.insert(i, length)
        if i + 1 < len(starts) and starts[i] + lengths[i] == starts[i + 1]:
            lengths[i] += lengths[i + 1]
            del starts[i + 1], lengths[i + 1]


def _runs(sorted_pages: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted page ids as (start, length)."""
    runs: list[tuple[int, int]] = []
    for page in sorted_pages:
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((page, 1))
    return runs


@register("reserve", "max", help="contiguous: reserve max_model_len tokens per request (Orca Max)")
def reserve_max(total_len: int, max_model_len: int) -> int:
    """Tokens reserved: the model's maximum length, whatever the request needs."""
    return max_model_len


@register("reserve", "pow2", help="contiguous: reserve the next power of two >= the real length")
def reserve_pow2(total_len: int, max_model_len: int) -> int:
    """Tokens reserved: the real total length rounded up to a power of two (<= max_model_len)."""
    return min(1 << max(total_len - 1, 0).bit_length(), max(max_model_len, total_len))


@register(
    "reserve", "oracle", help="contiguous: reserve exactly the real total length (Orca Oracle)"
)
def reserve_oracle(total_len: int, max_model_len: int) -> int:
    """Tokens reserved: exactly prompt plus output, as if the future were known."""
    return total_len
