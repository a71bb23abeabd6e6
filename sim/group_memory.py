"""Pool pages each KV-cache group of a hybrid model holds over a run: the per-group rows of the
summary (`kv_group_<i>_peak_pages`, `kv_group_<i>_mean_pages`).

Sampled where the step loop samples memory (after a step's decisions), and weighted by the
step's duration as `mean_kv_usage_perc` is. A group's pages are those in its block tables
(`HybridKVCacheManager.pages_held_by_group`): a prefix-hit page two requests share counts
once per request; cached pages no request holds do not count.
"""

from __future__ import annotations

from typing import Any, Protocol


class GroupPages(Protocol):
    """A manager that reports pages per KV-cache group (`HybridKVCacheManager`)."""

    def pages_held_by_group(self) -> list[int]: ...


class GroupMemory:
    """Peak and duration-weighted mean pages per KV-cache group over a run's steps."""

    __slots__ = ("_last", "_manager", "_num_steps", "_peak", "_plain_sum", "_total_s",
                 "_weighted")

    def __init__(self, manager: GroupPages) -> None:
        self._manager = manager
        num_groups = len(manager.pages_held_by_group())
        self._peak = [0] * num_groups
        self._weighted = [0.0] * num_groups  # sum of pages x step seconds
        self._plain_sum = [0] * num_groups  # sum of pages, for runs whose steps took no time
        self._total_s = 0.0
        self._num_steps = 0
        self._last: list[int] = [0] * num_groups

    def sample(self) -> None:
        """Pages each group holds now: after a step's decisions, before it runs."""
        self._last = pages = self._manager.pages_held_by_group()
        self._peak = [max(a, b) for a, b in zip(self._peak, pages, strict=True)]

    def record(self, duration_s: float) -> None:
        """The step sampled last ran for `duration_s`."""
        pages = self._last
        self._weighted = [w + p * duration_s for w, p in zip(self._weighted, pages, strict=True)]
        self._plain_sum = [s + p for s, p in zip(self._plain_sum, pages, strict=True)]
        self._total_s += duration_s
        self._num_steps += 1

    def summary(self) -> dict[str, Any]:
        """Flat summary keys: each group's peak pages and its mean pages over the steps, each
        weighted by its duration (equally when no step took time)."""
        out: dict[str, Any] = {}
        for index, peak in enumerate(self._peak):
            if self._total_s > 0:
                mean = self._weighted[index] / self._total_s
            else:
                mean = self._plain_sum[index] / self._num_steps if self._num_steps else 0.0
            out[f"kv_group_{index}_peak_pages"] = peak
            out[f"kv_group_{index}_mean_pages"] = float(mean)
        return out


def group_memory_of(manager: object) -> GroupMemory | None:
    """A sampler of `manager`'s pages per group, or None for a manager of one group."""
    if not hasattr(manager, "pages_held_by_group"):
        return None
    return GroupMemory(manager)  # type: ignore[arg-type]
