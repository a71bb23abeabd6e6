"""The precision mix step by step: a row per step of the pages at each level and the pages
demoted into each, what the run's step table adds as columns and its summary sums."""

from __future__ import annotations

from array import array
from typing import Any

from kvlab.metrics.precision_mix import (
    DEMOTIONS_TO_LEVEL,
    PAGES_AT_LEVEL,
    REQUANTIZED_PAGES,
    SAVED_CONTEXT,
    SPARED_PAGES,
)


class PrecisionMix:
    """Per step, sampled at its start once its demotions are made: the held and cached pages at
    each level (`pages_at_level[k]`, level 0 the cache's dtype) and the pages demoted into each
    level k >= 1 in it (`demotions_to_level[k]`; a page stepped down two levels counts once in
    each), and the whole pages at the cache's dtype the held demoted pages no longer need
    (`spared_pages`: the step table's used pages less these are the bytes held), that one as
    the step's memory is recorded (`note_spared`: after its allocations), and the context
    tokens the step's batch reads less for its demoted pages (`saved_tokens`, `note_spared`
    too: once the batch is known) and its requantizations' pages (`requantized_pages`,
    `note_requantized`: once its MemOps are). A manager serving
    several runs (the engine's) samples them all: a run's rows are the last as many as its
    steps (`step_columns`)."""

    __slots__ = ("_demotions_before", "demotions_to_level", "pages_at_level",
                 "requantized_pages", "saved_tokens", "spared_pages")

    def __init__(self, depth: int) -> None:
        self.pages_at_level = [array("q") for _ in range(depth + 1)]
        self.demotions_to_level = [array("q") for _ in range(depth + 1)]  # (index 0 unused)
        self._demotions_before = [0] * (depth + 1)
        self.spared_pages = array("q")
        self.saved_tokens = array("d")
        self.requantized_pages = array("d")

    def __len__(self) -> int:
        return len(self.pages_at_level[0])

    def add(self, num_pages: int, num_at_level: list[int], demotions: list[int],
            num_spared: int, num_saved_tokens: float = 0.0, num_requantized: float = 0.0
            ) -> None:
        """One step: `num_pages` held and cached pages, `num_at_level[k]` of them at level
        k >= 1 (index 0 unused, 0), `demotions[k]` pages demoted into level k ever,
        `num_spared` pages spared and `num_saved_tokens` context tokens saved (until
        `note_spared`), `num_requantized` pages requantized (until `note_requantized`)."""
        self.spared_pages.append(num_spared)
        self.saved_tokens.append(num_saved_tokens)
        self.requantized_pages.append(num_requantized)
        before = self._demotions_before
        self.pages_at_level[0].append(num_pages - sum(num_at_level))
        for level in range(1, len(before)):
            self.pages_at_level[level].append(num_at_level[level])
            self.demotions_to_level[level].append(demotions[level] - before[level])
            before[level] = demotions[level]

    def clear(self) -> None:
        """Drop every row (a server that keeps no profile bounds its memory so); demotions
        go on counting from the totals seen last."""
        for rows in (*self.pages_at_level, *self.demotions_to_level, self.spared_pages):
            del rows[:]
        del self.saved_tokens[:], self.requantized_pages[:]

    def note_spared(self, num_spared: int, num_saved_tokens: float) -> None:
        """The step's spared pages as its memory is recorded (preemptions since its start
        freed demoted pages), and the context tokens its batch's demoted pages save."""
        self.spared_pages[-1] = num_spared
        self.saved_tokens[-1] = num_saved_tokens

    def note_requantized(self, num_pages: float) -> None:
        """The step's requantizations, in pages at the cache's dtype read and written, halved
        (`PrecisionDriver.requantized_pages`)."""
        self.requantized_pages[-1] = num_pages

    def step_columns(self, num_steps: int) -> dict[str, array[Any]]:
        """The last `num_steps` rows as step-table columns: `num_pages_at_level_K` for every
        level, `num_demotions_to_level_K` for every level below the cache's dtype,
        `num_spared_pages`, `num_saved_context_tokens`, `num_requantized_pages`."""
        start = len(self) - num_steps
        assert start >= 0, "a run's steps are the mix's last rows"
        columns: dict[str, array[Any]] = {f"{PAGES_AT_LEVEL}{level}": pages[start:]
                                          for level, pages in enumerate(self.pages_at_level)}
        for level in range(1, len(self.demotions_to_level)):
            columns[f"{DEMOTIONS_TO_LEVEL}{level}"] = self.demotions_to_level[level][start:]
        columns[SPARED_PAGES] = self.spared_pages[start:]
        columns[SAVED_CONTEXT] = self.saved_tokens[start:]
        columns[REQUANTIZED_PAGES] = self.requantized_pages[start:]
        return columns
