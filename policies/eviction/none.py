"""No eviction policy, because no prefix caching: freed pages are free at once."""

from __future__ import annotations

from kvlab.policies.registry import register


@register("eviction", "none", help="no prefix caching: every freed page is free at once")
class NoEviction:
    """Holds nothing; the manager never hashes pages when this is chosen."""

    __slots__ = ()
    caches = False

    def __len__(self) -> int:
        return 0

    def __contains__(self, page_id: int) -> bool:
        return False

    def add(self, page_id: int, depth: int, key: object) -> None:
        """Never called: nothing is cached."""
        raise AssertionError("no prefix caching")

    def remove(self, page_id: int) -> None:
        """Never called: nothing is cached."""
        raise AssertionError("no prefix caching")

    def on_hit(self, page_id: int) -> None:
        """Never called: nothing is cached."""

    def pop_victim(self) -> tuple[int, object]:
        """Nothing to evict."""
        raise LookupError("no cached page to evict")

    def pages(self) -> list[int]:
        """None."""
        return []
