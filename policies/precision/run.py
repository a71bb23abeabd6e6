"""Age demotions carried inside a decode run (the simulator's fast path, `decode_path.py`).

In a run every sequence gains one token a step, so the step at which each of its pages reaches
a level is known ahead: page i reaches level L at the step whose start sees
(i + 1) * page_size + L * recent tokens, and the next page of that level `page_size` steps
later. `RunDemotions` lists them per step, in the order `PrecisionDriver.begin_step` would
demote them (sequences in the manager's order, levels in turn), tells the run's timer what each
step saves and requantizes, and applies the demotions of the steps the run took, step by step,
when it is committed: the same levels, ledger, ballast and samples as stepping.

The timer's figures are running sums of the ladder's byte ratios. Stepping adds them in another
order, so the two agree to the last bit only where every sum is exact: byte ratios that are
binary fractions (`exact_ratios`; every dtype's row over a power-of-two row is). Elsewhere runs
stop short of a demotion, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvlab.policies.groups.table import SeqState
    from kvlab.policies.precision.driver import PrecisionDriver

    # a sequence's driver entry: (pages walked per level, [tokens at which a page next
    # demotes, the context its demoted pages spare]); a walk: (the sequence's state, its
    # entry, level, the step, the first and the end index of the pages it demotes, the pages
    # the sequence held before the run)
    Entry = tuple[list[int], list[float]]
    Walk = tuple[SeqState, Entry, int, int, int, int, int]
    # a sequence due a walk in the run: its position in the manager's order, state, entry,
    # pages held before the run, its next page per level (None: its entry's, not copied yet)
    # and its tokens before the run
    Due = list[Any]

_POSITION = itemgetter(0)  # a due sequence's position in the manager's order
# A run's plan adds at first the sequences that walk in its first steps: most runs end sooner
# (an arrival), and the rest are added when a later step is asked.
_WINDOW = 4
_FRACTION_BITS = 24  # a ratio is exact if a multiple of 2**-24: sums stay exact far past need


def _next_demotion(walked: list[int], page_size: int, recent: int, levels: range) -> int:
    """The tokens at which a sequence with `walked` pages per level demotes its next page."""
    if len(levels) == 2:  # (the usual ladder: spelled out, a generator costs twice)
        one, two = (walked[1] + 1) * page_size + recent, (walked[2] + 1) * page_size + 2 * recent
        return one if one <= two else two
    return min((walked[level] + 1) * page_size + level * recent for level in levels)


def exact_ratios(values: Iterable[float]) -> bool:
    """Whether every value is a multiple of 2**-24 below 2**20 (sums of millions of them are
    then exact in a double, in any order)."""
    return all(abs(v) < 2 ** 20 and (v * 2 ** _FRACTION_BITS).is_integer() for v in values)


class RunDemotions:
    """The demotions due in the next `num_steps` decode steps of `requests` (every sequence
    of `driver`'s manager), per step: the first step's (where a sequence not walked yet, or
    past a prefill, may demote many pages), then a page per level every `page_size` steps."""

    __slots__ = ("_at", "_built", "_driver", "_dues", "_gaps", "_horizon", "_levels",
                 "_requantized", "_requests", "_saved", "_saved_tokens", "_states", "_step",
                 "first", "new_entries", "num_steps")

    def __init__(self, driver: PrecisionDriver, requests: list[Any], num_steps: int) -> None:
        self._driver = driver
        self._requests = requests
        self.num_steps = num_steps
        self._built = False  # (built when first asked: the run may not be taken)
        # the states without an entry, each with the one `begin_step` would make for it
        self.new_entries: list[tuple[SeqState, Entry]] = []
        # the first step's walks, in demotion order
        self.first: list[Walk] = []
        # step -> the sequences with a page due then (`Due`: each one's next page per level),
        # a step's walks made when it is asked: most runs end before most sequences walk
        self._at: dict[int, list[Due]] = {}
        # the sequences in the manager's order, each one's steps to its next walk, and the
        # steps its sequences are added for (`_look_ahead`: the rest when a later one is asked)
        self._states: list[SeqState] = []
        self._gaps: list[int] = []
        self._horizon = 0
        # the timer's walk (`costs`): steps seen, the context spared, levels it gave pages
        self._step = 0
        self._saved = 0.0
        self._levels: dict[int, int] = {}
        self._dues: list[list[Walk]] = []  # each step's walks as `costs` found them
        self._saved_tokens: list[float] = []  # each step's context saved, as `costs` gave it
        self._requantized: list[float] = []  # and its pages requantized (halved), likewise

    def _build(self) -> None:
        driver = self._driver
        policy, page_size = driver.policy, driver.manager.page_size
        depth, recent = driver.ledger.ladder.depth, policy.recent
        levels = range(1, min(depth, policy.depth) + 1)
        states = self._states = list(driver.seqs.values())
        # each sequence's steps to its next walk (step j starts with its tokens + j; 0 or
        # less: it walks at the first step, as `_demote_by_age` would, or it is new)
        gaps = self._gaps = [entry[1][0] - state.num_tokens if (entry := state.precision)
                             is not None else 0 for state in states]
        self._horizon = min(_WINDOW, self.num_steps)
        first = self.first
        for position in [p for p, gap in enumerate(gaps) if gap < self._horizon]:
            state, gap = states[position], gaps[position]
            entry, num_tokens = state.precision, state.num_tokens
            if gap > 0:
                self._add(gap, [position, state, entry, len(state.pages), None, num_tokens])
                continue
            if entry is None:
                entry = ([0] * (depth + 1), [0, 0.0])
                self.new_entries.append((state, entry))
            walked, held = entry[0], len(state.pages)  # (`_demote_by_age` walks it now)
            after = walked[:]  # each level's next page once the first step walked
            for level in levels:
                upto = max(0, (num_tokens - level * recent) // page_size)  # (pages held)
                if upto > walked[level]:
                    first.append((state, entry, level, 0, walked[level], upto, held))
                    after[level] = upto
            self._add(min((after[level] + 1) * page_size + level * recent - num_tokens
                          for level in levels),
                      [position, state, entry, held, after, num_tokens])
        self._saved = driver.num_saved_pages(self._requests)  # (new entries spare none yet)
        self._built = True

    def _look_ahead(self, step: int) -> None:
        """Add the sequences whose first walk is at `step` or before (past the horizon so
        far): their entries are as `_build` found them (a sequence walks only once added)."""
        low, states, gaps = self._horizon, self._states, self._gaps
        high = self._horizon = min(self.num_steps, max(2 * low, step + 1))
        for position in [p for p, gap in enumerate(gaps) if low <= gap < high]:
            state, gap = states[position], gaps[position]
            entry = state.precision
            # (its tokens before the run from its entry: the state's move on at the commit,
            # and so do its pages, which only the timer reads, before it)
            self._add(gap, [position, state, entry, len(state.pages), None, entry[1][0] - gap])

    def _add(self, step: int, item: Due) -> None:
        """`item`'s sequence walks a page next at `step` (nothing past the run)."""
        if step < self.num_steps:
            due = self._at.get(step)
            if due is None:
                self._at[step] = [item]
            else:
                due.append(item)

    def due(self, step: int) -> list[Walk]:
        """The page walks of `step` (sequence, entry, level, step, first and end page index,
        pages the sequence held before the run), in demotion order; asked in order from 0."""
        if not self._built:
            self._build()
        if not step:
            return self.first
        if step >= self._horizon:
            self._look_ahead(step)
        items = self._at.pop(step, None)
        if items is None:
            return []
        if len(items) > 1:  # (sequences first due here, and those due again, by position)
            items.sort(key=_POSITION)
        driver = self._driver
        page_size, recent = driver.manager.page_size, driver.policy.recent
        levels = range(1, min(driver.ledger.ladder.depth, driver.policy.depth) + 1)
        due = []
        for item in items:
            _, state, entry, held, after, num_tokens = item
            if after is None:
                after = item[4] = entry[0][:]
            upcoming = self.num_steps
            for level in levels:
                index = after[level]
                at = (index + 1) * page_size + level * recent - num_tokens
                if at == step:
                    due.append((state, entry, level, step, index, index + 1, held))
                    after[level] = index + 1
                    at += page_size
                if at < upcoming:
                    upcoming = at
            self._add(upcoming, item)
        return due

    def costs(self, step: int) -> tuple[float, float]:
        """For the run's next step (`step`, asked in order from 0): the context tokens the
        batch's demoted pages spare it, and the pages it requantizes, in pages at the cache's
        dtype read and written (`precision_step_time_s`'s two figures; `end_step` lists a
        page demoted twice in a step once)."""
        assert step == self._step, "steps are costed in order"
        self._step += 1
        driver = self._driver
        saving, ratios, levels = driver.saving, driver.requantize_ratios, self._levels
        known = driver.ledger.levels
        pages = 0.0
        first_level: dict[int, int] = {}  # page -> its level before the step
        due = self.due(step)
        self._dues.append(due)  # (for `commit`)
        if not due:  # (most steps)
            self._saved_tokens.append(saved := self._saved * driver.manager.page_size)
            self._requantized.append(0.0)
            return saved, 0.0
        saved = self._saved
        for state, _, level, _, start, end, num_held in due:
            saved += (end - start) * saving[level]
            if end - start == 1 and start < num_held:  # (every walk past the first step)
                page = state.pages[start]
                before = levels.get(page, known[page])
                if before < level:
                    if page not in first_level:
                        first_level[page] = before
                    levels[page] = level
                continue
            for index in range(start, end):
                if index < num_held:  # a page held before the run: maybe shared
                    page = state.pages[index]
                    before = levels.get(page, known[page])
                    if before < level:
                        first_level.setdefault(page, before)
                        levels[page] = level
                else:  # a page the run took: this walk's alone, a level a visit
                    pages += ratios[level - 1, level]
        for page, before in first_level.items():
            pages += ratios[before, levels[page]]
        self._saved = saved
        self._saved_tokens.append(saved := saved * driver.manager.page_size)
        self._requantized.append(pages := pages / 2)
        return saved, pages

    def _apply(self, due: list[Walk]) -> int:
        """A step's walks `due` applied to the ledger, a level at a time, in turn: the same
        ledger as walk by walk (a page demoted to two levels in the step still steps through
        both; a shared page once a level); each walk's entry moved on as `_demote_by_age`
        leaves it. Returns the pages demoted (no MemOps: the simulator charged them)."""
        driver = self._driver
        saving, page_size, recent = driver.saving, driver.manager.page_size, driver.policy.recent
        levels = range(1, min(driver.ledger.ladder.depth, driver.policy.depth) + 1)
        one_level, two_levels = len(levels) == 1, len(levels) == 2
        by_level: list[list[int]] = [[] for _ in range(len(saving))]
        total = 0.0  # (exact sums: `exact_ratios`)
        for state, entry, level, _, start, end, _ in due:
            if end - start == 1:  # (every walk past the first step)
                by_level[level].append(state.pages[start])
            else:
                by_level[level] += state.pages[start:end]
            walked, info = entry
            walked[level] = end
            spared = (end - start) * saving[level]
            info[1] += spared
            total += spared
            if two_levels:  # (`_next_demotion`, spelled out: a call costs)
                one, two = (walked[1] + 1) * page_size + recent, \
                    (walked[2] + 1) * page_size + 2 * recent
                info[0] = one if one <= two else two
            elif one_level:
                info[0] = (walked[1] + 1) * page_size + recent
            else:
                info[0] = _next_demotion(walked, page_size, recent, levels)
        driver.saved_pages += total
        demoted: list[int] = []
        befores: list[int] = []
        for level, walks in enumerate(by_level):
            if walks:
                driver.ledger.demote_pages(
                    walks if len(walks) == 1 else list(dict.fromkeys(walks)), level, demoted,
                    befores)
        return len(demoted)

    def _walk_new_entries(self) -> None:
        """The new entries' next demotion, once the first step walked them (demoting or
        not), as `_demote_by_age` leaves them."""
        driver = self._driver
        page_size, recent = driver.manager.page_size, driver.policy.recent
        levels = range(1, min(driver.ledger.ladder.depth, driver.policy.depth) + 1)
        for _, (walked, info) in self.new_entries:
            info[0] = _next_demotion(walked, page_size, recent, levels)

    def commit(self, num_steps: int, num_free_before: int, pages_taken: list[int]) -> list[int]:
        """Apply the demotions of the run's first `num_steps` steps (its pages all taken:
        `pages_taken` by the end of each, `num_free_before` free before it) with the ballast
        settled and the precision mix sampled at each step's start, as `begin_step` does.
        Returns the ballast pages released by the start of each step, cumulated."""
        driver = self._driver
        ledger, policy = driver.ledger, driver.policy
        sample = driver.mix.add
        held = (driver.manager.num_total_pages + ledger.num_extra - num_free_before
                - ledger.num_ballast_pages)
        if not self._built:
            self._build()
        for state, entry in self.new_entries:
            state.precision = entry
        released: list[int] = []
        num_released = 0
        taken_before = [0, *pages_taken[:-1]]  # (pages taken by each step's start)
        dues, num_at, num_demoted, spared = self._dues, ledger.num_at_level, 0, 0
        # (the steps costed: the timer's figures)
        saved_tokens, requantized = self._saved_tokens, self._requantized
        for step in range(num_steps):
            if step == len(dues):  # (a run committed without its timer: costed as it would)
                self.costs(step)
            due = dues[step]
            if due or not step:  # (most steps: nothing demoted, nothing settled)
                num_demoted += self._apply(due)
                if not step:
                    self._walk_new_entries()
                num_ballast = ledger.num_ballast_pages  # (the first step settles what pages
                ledger.settle()  # dropped before owe)
                num_released += num_ballast - ledger.num_ballast_pages
                spared = ledger.num_spared_pages
            released.append(num_released)
            sample(held + taken_before[step], num_at, ledger.demotions, spared,
                   saved_tokens[step], requantized[step])
        if policy.recompute:  # a lookup from before may reach them
            driver.manager.pool.cache_epoch += num_demoted
        return released
