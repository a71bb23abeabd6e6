"""A decode run's demotions noted against the ledger and written to it once (run.py's commit):
the levels, bytes and pages per level of the ledger's own calls, with the ballast released and
the precision mix read at each step meanwhile."""

from __future__ import annotations

from itertools import compress

from kvlab.policies.precision.ledger import PrecisionLedger, read_levels

# Up to this many pages a walk is noted page by page; more, a pass at a time, as the ledger's
# own calls (their fixed costs outweigh a few pages, not a backlog's hundreds).
_FEW = 16


class NotedDemotions:
    """Demotions of pages in block tables noted against `ledger`, page by page, and written to
    it at once (`write`): the same levels, bytes and counts as its `demote_pages` call by call
    (its `step_pairs` aside: a decode run lists no requantizations). Meanwhile the ballast the
    bytes noted pay for is released as `settle` would (`release_ballast`) and the pages per
    level are `num_at_level`: a decode run's commit, settling and sampling at each step."""

    __slots__ = ("_units", "demotions", "freed_units", "ledger", "levels", "num_at_level")

    def __init__(self, ledger: PrecisionLedger) -> None:
        self.ledger = ledger
        self.levels: dict[int, int] = {}  # page -> the level noted
        self.freed_units = ledger.freed_units
        self.num_at_level = list(ledger.num_at_level)
        self.demotions = [0] * len(self.num_at_level)
        row, size = ledger.ladder.row_bytes, ledger.unit // ledger.ladder.row_bytes[0]
        # (before, after) -> the bytes a page demoted so no longer needs, in units
        self._units = [[(row[before] - level_row) * size for level_row in row] for before in
                       range(len(row))]

    def demote(self, pages: list[int], level: int) -> None:
        """Each of `pages` (distinct, in block tables) above `level` demoted to it, in order."""
        known, levels, units = self.ledger.levels, self.levels, self._units
        num_at = self.num_at_level
        if len(pages) > _FEW and levels.keys().isdisjoint(pages):  # (C loops: a backlog)
            self._demote_unnoted(pages, level)
            return
        for page in pages:
            before = levels.get(page)
            if before is None:
                before = known[page]
            if before < level:
                levels[page] = level
                self.freed_units += units[before][level]
                if before:
                    num_at[before] -= 1
                num_at[level] += 1
                self.demotions[level] += 1

    def _demote_unnoted(self, pages: list[int], level: int) -> None:
        """`demote` of many pages none of which is noted yet, a pass at a time."""
        found = read_levels(self.ledger.levels, pages)
        if max(found, default=level) >= level:
            keep = [before < level for before in found]
            pages, found = list(compress(pages, keep)), list(compress(found, keep))
        self.levels.update(dict.fromkeys(pages, level))
        num_at, units = self.num_at_level, self._units
        for before in range(level):
            count = found.count(before)
            self.freed_units += count * units[before][level]
            if before:
                num_at[before] -= count
        num_at[level] += len(found)
        self.demotions[level] += len(found)

    def release_ballast(self) -> int:
        """Release the ballast that the bytes noted so far pay for, as `settle` would (never
        owing: the bytes freed only grow); returns how many pages."""
        ledger = self.ledger
        target, ballast = ledger.num_extra - self.freed_units // ledger.unit, ledger.ballast
        assert len(ballast) >= target, "a ledger in debt: settle it first"
        if len(ballast) == target:
            return 0
        give = ballast[target:]
        del ballast[target:]
        ledger.pool.allocator.release(give)
        return len(give)

    def write(self) -> int:
        """The levels and counts noted, written to the ledger; returns the pages demoted."""
        ledger, levels = self.ledger, self.levels
        for level in set(levels.values()):
            ledger._write([page for page, at in levels.items() if at == level], level)
        ledger.freed_units = self.freed_units
        ledger.num_at_level[:] = self.num_at_level
        for level, count in enumerate(self.demotions):
            ledger.demotions[level] += count
        return sum(self.demotions)
