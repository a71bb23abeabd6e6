"""The precision mix step by step: a row per step of the pages at each level and the pages
demoted into each, what the run's step table adds as columns and its summary sums."""

from __future__ import annotations

from array import array

from kvlab.metrics.precision_mix import DEMOTIONS_TO_LEVEL, PAGES_AT_LEVEL


class PrecisionMix:
    """Per step, sampled at its start once its demotions are made: the held and cached pages at
    each level (`pages_at_level[k]`, level 0 the cache's dtype) and the pages demoted into each
    level k >= 1 in it (`demotions_to_level[k]`; a page stepped down two levels counts once in
    each). A manager serving several runs (the engine's) samples them all: a run's rows are
    the last as many as its steps (`step_columns`)."""

    __slots__ = ("_demotions_before", "demotions_to_level", "pages_at_level")

    def __init__(self, depth: int) -> None:
        self.pages_at_level = [array("q") for _ in range(depth + 1)]
        self.demotions_to_level = [array("q") for _ in range(depth + 1)]  # (index 0 unused)
        self._demotions_before = [0] * (depth + 1)

    def __len__(self) -> int:
        return len(self.pages_at_level[0])

    def add(self, num_pages: int, num_at_level: list[int], demotions: list[int]) -> None:
        """One step: `num_pages` held and cached pages, `num_at_level[k]` of them at level
        k >= 1 (index 0 unused, 0), `demotions[k]` pages demoted into level k ever."""
        before = self._demotions_before
        self.pages_at_level[0].append(num_pages - sum(num_at_level))
        for level in range(1, len(before)):
            self.pages_at_level[level].append(num_at_level[level])
            self.demotions_to_level[level].append(demotions[level] - before[level])
            before[level] = demotions[level]

    def step_columns(self, num_steps: int) -> dict[str, array]:
        """The last `num_steps` rows as step-table columns: `num_pages_at_level_K` for every
        level, `num_demotions_to_level_K` for every level below the cache's dtype."""
        start = len(self) - num_steps
        assert start >= 0, "a run's steps are the mix's last rows"
        columns = {f"{PAGES_AT_LEVEL}{level}": pages[start:]
                   for level, pages in enumerate(self.pages_at_level)}
        for level in range(1, len(self.demotions_to_level)):
            columns[f"{DEMOTIONS_TO_LEVEL}{level}"] = self.demotions_to_level[level][start:]
        return columns
