"""Applies a precision policy to a `KVCacheManager` at each step's start: demotes pages by age
(and cached-free prefix pages), settles the ledger's ballast, and hands the step's
requantizations to its `MemOps`."""

from __future__ import annotations

import itertools
import math
from itertools import compress, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from kvlab.policies.outputs import MemOps
from kvlab.policies.precision.age import AgeDemotion
from kvlab.policies.precision.cached import CachedVictims
from kvlab.policies.precision.ladder import PrecisionLadder
from kvlab.policies.precision.ledger import (
    DemotedPages,
    PrecisionLedger,
    read_levels,
)
from kvlab.policies.precision.mix import PrecisionMix
from kvlab.policies.precision.run import RunDemotions, exact_ratios
from kvlab.specs.kv_groups import NULL_PAGE

if TYPE_CHECKING:
    from kvlab.policies.groups.table import SeqState
    from kvlab.policies.manager import KVCacheManager
    from kvlab.policies.prefix_lookup import PageStops

_LEVELS = itemgetter(1, 2)  # a requantization's (level before, level after)


class PrecisionDriver:
    """One manager's demotions: the policy's rule over each sequence's block table, a step at a
    time; `num_pages` is the device's pages at the cache's dtype (the pool holds more ids:
    `ledger.py`)."""

    __slots__ = ("_afters", "_befores", "_charged", "_dropped_at", "_dups", "_exact",
                 "_levels_demoted", "_pending", "_victims", "ledger", "manager", "mix",
                 "num_pages", "policy", "requantize_ratios", "run", "saved_pages", "saving", "seqs")

    def __init__(self, manager: KVCacheManager, policy: AgeDemotion, ladder: PrecisionLadder,
                 num_pages: int) -> None:
        self.manager = manager
        self.policy = policy
        self.num_pages = num_pages
        self.ledger = PrecisionLedger(manager.pool, ladder, num_pages, manager.page_size)
        # The manager's sequences, each one's entry its state's `precision`: (pages walked per
        # level, [tokens at which a page next demotes, the attention reads its walked pages
        # spare, in pages at the cache's dtype]).
        self.seqs = manager.seq_states
        # what a page's read spares, in pages at the cache's dtype, as it steps into each level
        self.saving = [0.0] + [ladder.ratio(level - 1) - ladder.ratio(level)
                               for level in range(1, ladder.depth + 1)]
        # the step's demotions so far: the pages, and each one's level before (in step)
        self._pending: list[int] = []
        self._befores: list[int] = []
        # each one's level after: its level at the step's end unless a page was listed twice
        # (`_dups`) or a demoted page's content left since (`_dropped_at`: the ledger's count)
        self._afters: list[int] = []
        self._dups = False
        self._dropped_at = 0
        # the step's requantizations, their number and the pages they cost (`end_step`)
        self._charged: tuple[list, int, float] | None = None
        self._levels_demoted = 0  # a bit per level the step demoted pages to
        # (level before, level after) -> the two levels' byte ratios added: a requantization
        # reads a page at one and writes it at the other (sim/precision_costs.py)
        self.requantize_ratios = {(before, after): ladder.ratio(before) + ladder.ratio(after)
                                  for after in range(ladder.depth + 1)
                                  for before in range(after)}
        # runs may carry demotions (run.py): their timer's sums are exact
        self._exact = exact_ratios([*self.saving, *self.requantize_ratios.values()])
        self.run: RunDemotions | None = None  # the decode run `plan_run` planned last
        self._victims = CachedVictims(self.ledger, manager.pool)  # (for `cached=1`)
        # The context spared summed over every sequence's entry (exact where `_exact`).
        self.saved_pages = 0.0
        self.mix = PrecisionMix(ladder.depth)  # pages at each level, step by step

    def prefix_stops(self) -> PageStops | None:
        """The pages a prefix hit may not reach: with `recompute=1` the demoted ones (a hit
        stops there and the rest is computed again at the cache's dtype); None: any page."""
        return DemotedPages(self.ledger.levels) if self.policy.recompute else None

    def begin_step(self) -> None:
        """Before the step's decisions: settle the ballast for pages dropped since, then
        demote where the policy says (the bytes freed are the step's to allocate)."""
        ledger, pool = self.ledger, self.manager.pool
        ledger.settle()
        self._dropped_at = ledger.num_dropped
        ledger.step_pairs = dict.fromkeys(ledger.step_pairs, 0)
        self._charged = None
        reclaimable = pool.allocator.num_free_pages + len(pool.evictor)
        if self.policy.under_pressure(reclaimable, self.num_pages):
            self._demote_by_age()
            if self.policy.cached:
                self._demote_cached()
            ledger.settle()
        self._sample()

    def end_step(self, ops: MemOps) -> None:
        """The step's requantizations run first of its MemOps, one per page from its level
        before the step to its level now (a page whose content left in the step needs none);
        the mix notes what they cost (`requantized_pages`)."""
        if self._pending:
            self._list_requantizations(ops)
            self.mix.note_requantized(self.requantized_pages(ops.requantize))

    def _list_requantizations(self, ops: MemOps) -> None:
        """`end_step`'s list: the step's demotions, in order, each page once."""
        pages, befores, afters = self._pending, self._befores, self._afters
        self._pending, self._befores, self._afters = [], [], []
        levels_demoted, self._levels_demoted = self._levels_demoted, 0
        dups, self._dups = self._dups, False
        if not dups and self.ledger.num_dropped == self._dropped_at:  # (the usual step)
            requantize = ops.requantize
            requantize[:0] = list(zip(pages, befores, afters, strict=True))
            if self._exact:  # (what they cost sums exactly in any order: from the counts)
                ratios = self.requantize_ratios
                self._charged = (requantize, len(requantize), sum(
                    count * ratios[pair] for pair, count in self.ledger.step_pairs.items()
                    if count) / 2)
            return
        # A page demoted twice in the step is listed once, in first order, from its first
        # level before: only where a sequence walked two levels one at a time, or a page two
        # sequences share was demoted (`_dups`), and the step demoted to two levels or more.
        if dups and levels_demoted & (levels_demoted - 1):
            first = dict(zip(reversed(pages), reversed(befores), strict=True))
            if len(first) < len(pages):
                pages = list(dict.fromkeys(pages))
                befores = list(map(first.__getitem__, pages))
        after = list(read_levels(self.ledger.levels, pages))
        if 0 in after:  # content that left in the step (C loops: whole prompts)
            pages, befores = list(compress(pages, after)), list(compress(befores, after))
            after = list(filter(None, after))
        requantize = ops.requantize
        requantize[:0] = list(zip(pages, befores, after, strict=True))
        if self._exact:  # (each page's two ratios, summed by level: no tuple looked up)
            ratio = self.ledger.ladder.ratio
            self._charged = (requantize, len(requantize), sum(
                (befores.count(level) + after.count(level)) * ratio(level)
                for level in range(len(self.saving))) / 2)

    def requantized_pages(self, requantize: list[tuple[int, int, int]]) -> float:
        """What the step's `requantize` (`MemOps.requantize`) costs, in pages at the cache's
        dtype read and written: each page's two levels' byte ratios, summed, halved."""
        charged = self._charged
        if charged is not None and charged[0] is requantize and charged[1] == len(requantize):
            return charged[2]
        return sum(map(self.requantize_ratios.__getitem__, map(_LEVELS, requantize))) / 2

    def plan_run(self, requests: list[Any], max_steps: int) -> int:
        """How many (at most `max_steps`) of the next steps, each one decode token for every
        one of `requests` and nothing else, the simulator's decode fast path may take, with
        the demotions due in them planned (`run`): all of them where the ladder's ratios sum
        exactly (`exact_ratios`), else those before the first demotion. 0 where the next step
        may demote otherwise than by age as planned (a policy acting on pressure, a sequence
        not walked yet, a cached-free page to step down, a ledger in debt; ballast the ledger
        owes back is released at the run's first step, as `begin_step` does)."""
        self.run = None
        policy, ledger = self.policy, self.ledger
        if policy.pressure or len(ledger.ballast) < ledger.num_extra - ledger.freed_units \
                // ledger.unit:  # (a ledger in debt settles at every step's start)
            return 0
        seqs, steps = self.seqs, max_steps
        # Carried: the demotions from the first step's on (`RunDemotions`, once the manager
        # found every request a plain decode); else the steps before the first demotion.
        carried = self._exact and len(seqs) == len(requests)
        for request in [] if carried else requests:
            state = seqs.get(request.request_id)
            if state is None or state.precision is None:
                return 0
            gap = state.precision[1][0] - state.num_tokens  # step j starts with num_tokens + j
            if gap < steps:
                if gap < 1:
                    return 0
                steps = int(gap)
        if policy.cached and not self._victims.is_clean():
            return 0
        self.run = RunDemotions(self, requests, steps)
        return steps

    def commit_run(self, num_steps: int, num_free_before: int, pages_taken: list[int]
                   ) -> list[int]:
        """The run `plan_run` planned took `num_steps` steps, `pages_taken` pages by the end
        of each (cumulated), `num_free_before` free before it: apply its demotions and samples
        (`RunDemotions.commit`); returns the ballast pages released by each step, cumulated."""
        run, self.run = self.run, None
        assert run is not None and num_steps <= run.num_steps, "commit a planned run"
        released = run.commit(num_steps, num_free_before, pages_taken)
        # (no MemOps: the simulator charged the run's requantizations)
        self._pending, self._befores, self._afters = [], [], []
        self._levels_demoted, self._dups = 0, False
        return released

    def _demote_by_age(self) -> None:
        """Each sequence's pages past the recent tokens, one level per `recent` tokens."""
        manager, policy, ledger = self.manager, self.policy, self.ledger
        page_size, depth, recent = manager.page_size, ledger.ladder.depth, policy.recent
        top = min(depth, policy.depth)
        levels, saving = range(1, top + 1), self.saving
        batch: tuple[list[int], list[int]] = ([], [])  # (the step's short walks: pages, levels)
        walk_pages, walk_levels = batch
        spared_total, levels_demoted = 0.0, 0
        # (the sequences a page of which may demote: a comprehension looks at all of them
        # for a third of a loop's cost)
        for state in [state for state in self.seqs.values() if (entry := state.precision)
                      is None or state.num_tokens >= entry[1][0]]:
            entry = state.precision
            if entry is None:  # (new, or admitted again: a new state)
                entry = state.precision = ([0] * (depth + 1), [0, 0.0])
            num_tokens, info = state.num_tokens, entry[1]
            walked, pages = entry[0], state.pages
            num_pages = len(pages)
            if top > 1 and walked[1] < min(num_pages, (num_tokens - top * recent) // page_size):
                self._demote_backlog(state, entry, batch)  # (walks that overlap)
                continue
            next_at, short = math.inf, False
            for level in levels:
                # (policy.num_pages_at_least, spelled out: a call per level costs)
                want = (num_tokens - level * recent) // page_size
                upto = want if want < num_pages else num_pages
                done = walked[level]
                if upto > done:
                    if upto - done == 1:  # (the usual walk: a page a level)
                        walk_pages.append(pages[done])
                        walk_levels.append(level)
                    else:
                        walk_pages += pages[done:upto]
                        walk_levels += repeat(level, upto - done)
                    levels_demoted |= 1 << level
                    spared = (upto - done) * saving[level]
                    info[1] += spared
                    spared_total += spared
                    walked[level] = done = upto
                # page `walked[level]` reaches this level at this many tokens
                at = (done + 1) * page_size + level * recent
                if at < next_at:
                    next_at = at
                if upto < want:
                    short = True  # (pages not yet allocated: look again next step)
            info[0] = 0 if short else next_at
        self.saved_pages += spared_total  # (exact where it is read: `num_saved_pages`)
        self._levels_demoted |= levels_demoted
        self._demote_each(*batch)
        owners = manager.pool.owners  # (a page two tables hold may be demoted twice)
        if owners and self._pending and not owners.keys().isdisjoint(self._pending):
            self._dups = True

    def _demote_backlog(self, state: SeqState, entry: Any,
                        batch: tuple[list[int], list[int]]) -> None:
        """`state`'s pages walked to two levels or more at once, where the walks overlap (a
        prompt's backlog, or a sequence first seen): `_demote_walks`, its entry moved on."""
        policy, page_size, saving = self.policy, self.manager.page_size, self.saving
        walked, info = entry
        top, num_tokens, num_pages = len(walked) - 1, state.num_tokens, len(state.pages)
        top = min(top, policy.depth)
        wants = [max(0, (num_tokens - level * policy.recent) // page_size)
                 for level in range(1, top + 1)]
        uptos = [want if want < num_pages else num_pages for want in wants]
        self._demote_walks(state.pages, walked, uptos, batch)
        next_at = math.inf
        for level, upto, want in zip(range(1, top + 1), uptos, wants, strict=True):
            if upto > walked[level]:
                spared = (upto - walked[level]) * saving[level]
                info[1] += spared
                self.saved_pages += spared
                walked[level] = upto
            # page `walked[level]` reaches this level at this many tokens
            next_at = min(next_at, (walked[level] + 1) * page_size + level * policy.recent)
            if upto < want:
                next_at = 0  # (pages not yet allocated: look again next step)
        info[0] = next_at

    def _demote_walks(self, pages: list[int], walked: list[int], uptos: list[int],
                      batch: tuple[list[int], list[int]]) -> None:
        """A sequence's pages from `walked[level]` to `uptos[level - 1]` demoted to each
        level in turn: added to `batch` (`_demote_each`), or, two levels whose walks overlap
        (a backlog), after it in one pass (`PrecisionLedger.demote_walk`: each page listed
        once)."""
        if len(uptos) > 1 and max(walked[1:]) < min(uptos):  # (walks that overlap)
            self._demote_each(*batch)  # (in order: the walks before them first)
            batch[0].clear()
            batch[1].clear()
            start = walked[2]
            span = pages[start:uptos[0]]
            if len(uptos) == 2 and walked[1] >= start and uptos[1] <= uptos[0] \
                    and NULL_PAGE not in span:
                num = self.ledger.demote_walk(span, walked[1] - start, uptos[1] - start,
                                              self._pending, self._befores, self._afters)
                self._levels_demoted |= 6
                if self.policy.recompute:  # a lookup from before may reach them
                    self.manager.pool.cache_epoch += num
                return
            self._dups = True  # (never here: one walk at a time, a page listed twice)
            for level, upto in enumerate(uptos, 1):
                if upto > walked[level]:
                    self._demote(pages[walked[level]:upto], level)
            return
        for level, upto in enumerate(uptos, 1):
            if upto > walked[level]:
                walk = pages[walked[level]:upto]
                batch[0].extend(walk)
                batch[1].extend(repeat(level, len(walk)))
                self._levels_demoted |= 1 << level

    def _demote_each(self, pages: list[int], targets: list[int], any_twice: bool = False
                     ) -> None:
        """Each of `pages`, all in block tables, demoted to its level in `targets` where
        above it, in order, as walk by walk: in runs of distinct pages
        (`PrecisionLedger.demote_each`; a page two walks name is listed twice). Only a page
        two tables hold can be named twice, unless `any_twice`."""
        if not pages:
            return
        if NULL_PAGE in pages:
            keep = [page != NULL_PAGE for page in pages]
            pages, targets = list(compress(pages, keep)), list(compress(targets, keep))
        cuts = [0, len(pages)]
        owners = self.manager.pool.owners  # (only a page two tables hold can be named twice)
        if (any_twice or (owners and not owners.keys().isdisjoint(pages))) \
                and len(set(pages)) < len(pages):
            self._dups = True  # (rare: one call per stretch of distinct pages)
            seen: set[int] = set()
            for index, page in enumerate(pages):
                if page in seen:
                    cuts.insert(-1, index)
                    seen.clear()
                seen.add(page)
        ledger, pending, num = self.ledger, self._pending, 0
        for start, end in itertools.pairwise(cuts):
            run, levels = pages[start:end], targets[start:end]
            if levels.count(levels[0]) == len(levels):  # (one level: the walks' own call)
                num_before = len(pending)
                ledger.demote_pages(run, levels[0], pending, self._befores)
                self._afters += repeat(levels[0], len(pending) - num_before)
                num += len(pending) - num_before
            else:
                num += ledger.demote_each(run, levels, pending, self._befores, self._afters)
        if self.policy.recompute:  # a lookup from before may reach them
            self.manager.pool.cache_epoch += num

    def _demote_cached(self) -> None:
        """Cached-free prefix pages, next victims first, to the lowest level."""
        pages = self._victims.to_demote()
        if pages:
            self._demote(pages, self.ledger.ladder.depth)
            self.ledger.cache(pages)
            self._victims.mark_clean()

    def _demote(self, pages: list[int], level: int) -> None:
        """Each of `pages` above `level` requantized down to it, in order."""
        if NULL_PAGE in pages:
            pages = [page for page in pages if page != NULL_PAGE]
        num_before = len(self._pending)
        self.ledger.demote_pages(pages, level, self._pending, self._befores)
        self._afters += repeat(level, len(self._pending) - num_before)
        self._levels_demoted |= 1 << level
        if self.policy.recompute:  # a lookup from before may reach them
            self.manager.pool.cache_epoch += len(self._pending) - num_before

    def _sample(self) -> None:
        ledger, manager = self.ledger, self.manager
        held = (manager.num_total_pages + ledger.num_extra - manager.allocator.num_free_pages
                - ledger.num_ballast_pages)  # held and cached-free pages
        self.mix.add(held, ledger.num_at_level, ledger.demotions, ledger.num_spared_pages)

    def note_usage(self, requests: list[Any]) -> None:
        """The step's memory is being recorded (after its allocations and preemptions): its
        spared pages as they are now and the context its batch `requests` reads less
        (`PrecisionMix.note_spared`)."""
        self.mix.note_spared(self.ledger.num_spared_pages,
                             self.num_saved_context_tokens(requests))

    def num_saved_context_tokens(self, requests: list[Any]) -> float:
        """The KV tokens at the cache's dtype that `requests`' demoted pages spare attention
        from reading: each page walked to level k reads ratio(k) of its bytes (a request
        admitted again after preemption: its new sequence's, from its first walk on)."""
        return self.num_saved_pages(requests) * self.manager.page_size

    def num_saved_pages(self, requests: list[Any]) -> float:
        """`num_saved_context_tokens` in pages at the cache's dtype: where the ratios sum
        exactly in any order and `requests` are every sequence, the running total
        (`saved_pages`); else their sum, in their order."""
        seqs = self.seqs
        if self._exact and len(requests) == len(seqs):  # (the batch holds every sequence)
            return self.saved_pages
        saved = 0.0
        for request in requests:
            state = seqs.get(request.request_id)
            if state is not None and state.precision is not None:
                saved += state.precision[1][1]
        return saved

    def forget(self, state: SeqState) -> None:
        """`state`'s sequence left the manager (finished, preempted or swapped out)."""
        if state.precision is not None:
            self.saved_pages -= state.precision[1][1]
