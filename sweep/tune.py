"""Tuning: for each candidate configuration, the highest request rate at which enough requests
meet every SLO, found by bisection on the rate with the simulator, and the candidates ranked.

Goodput as vLLM defines it: a request is good when it completed and its TTFT, TPOT and E2EL
(those given) are within their SLOs. A rate is met when the good requests are at least
`min_attainment` of all the trace's requests (failed ones count as not good): 90% by default,
the SLO attainment DistServe's goodput is defined at. The search assumes that attainment falls
as the rate rises: it doubles (or halves) the rate from `start_rate` until the SLOs fail (or
hold), then bisects geometrically until the lowest failed rate is within `rate_tolerance` of
the highest met one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.errors import KvlabError
from kvlab.metrics import parse_goodput
from kvlab.sweep.executors import Executor
from kvlab.sweep.runner import ATTAINMENT_COLUMN, ERROR_COLUMN, KEY_COLUMN, PARAM_PREFIX
from kvlab.sweep.settings import run_key
from kvlab.sweep.store import SweepStore

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_MIN_ATTAINMENT = 0.9
SEARCHED = "request_rate"
# settings that set the arrivals themselves, which the search replaces
ARRIVAL_SETTINGS = ("request_rate", "time_scale", "ramp_up_strategy", "ramp_up_start_rps",
                    "ramp_up_end_rps")
# a probe's summary keys shown for the best rate of each candidate
REPORTED = ("slo_attainment", "request_goodput", "request_throughput", "output_throughput",
            "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "num_preemptions",
            "policy")


def _round(rate: float) -> float:
    """A probe rate with 4 significant digits (readable, and the same on every re-run)."""
    return float(f"{rate:.4g}")


@dataclass(slots=True)
class RateSearch:
    """Bisection for the highest rate in [min_rate, max_rate] at which a test passes, the test
    assumed to pass below some rate and fail above it.

    `rate_tolerance` is relative: the search stops when the lowest failed rate is within that
    share above the highest passed one. `passing` is the highest rate seen to pass, `failing`
    the lowest seen to fail. Ask `next_rate` for the rate to try, `record` its outcome; None
    means done: `passing` is the answer (None when even `min_rate` failed; `capped` when
    `max_rate` passed).
    """

    start_rate: float = 1.0
    rate_tolerance: float = 0.05
    min_rate: float = 0.01
    max_rate: float = 1000.0
    passing: float | None = None
    failing: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("start_rate", "min_rate", "max_rate", "rate_tolerance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise KvlabError(f"{name} {value!r}: expected a finite number > 0",
                                 parameters=(name,))
        if not self.min_rate <= self.start_rate <= self.max_rate:
            raise KvlabError(f"start_rate {self.start_rate:g} is outside [min_rate "
                             f"{self.min_rate:g}, max_rate {self.max_rate:g}]",
                             parameters=("start_rate", "min_rate", "max_rate"))

    @property
    def capped(self) -> bool:
        """True when the test passed at `max_rate`: the answer is a lower bound."""
        return self.passing is not None and self.passing >= self.max_rate

    def next_rate(self) -> float | None:
        """The next rate to try, None when the search is done."""
        low, high = self.passing, self.failing
        if low is None and high is None:
            return _round(self.start_rate)
        if high is None:
            assert low is not None
            return None if low >= self.max_rate else min(_round(2 * low), self.max_rate)
        if low is None:
            return None if high <= self.min_rate else max(_round(high / 2), self.min_rate)
        if high <= low * (1 + self.rate_tolerance):
            return None
        middle = _round(math.sqrt(low * high))
        return middle if low < middle < high else None

    def record(self, rate: float, passed: bool) -> None:
        """The outcome of trying `rate`."""
        self.probes.append((rate, passed))
        if passed:
            self.passing = rate if self.passing is None else max(self.passing, rate)
        else:
            self.failing = rate if self.failing is None else min(self.failing, rate)


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """The rate search's bounds and precision (requests/s; tolerance relative)."""

    start_rate: float = 1.0
    rate_tolerance: float = 0.05
    min_rate: float = 0.01
    max_rate: float = 1000.0

    def search(self) -> RateSearch:
        """A new search with these options (checked)."""
        return RateSearch(self.start_rate, self.rate_tolerance, self.min_rate, self.max_rate)


@dataclass(slots=True)
class _Candidate:
    settings: dict[str, Any]
    search: RateSearch
    rows: dict[float, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # columns shown beside its settings
    excluded: str | None = None  # why it is not searched (over a quality budget)


def check_candidates(candidates: Sequence[Mapping[str, Any]]) -> None:
    """A KvlabError when a candidate sets its own arrivals (the search sets the rate)."""
    for candidate in candidates:
        clash = [name for name in ARRIVAL_SETTINGS if name in candidate]
        if clash:
            raise KvlabError(f"tune searches the request rate itself; remove {clash[0]} from "
                             "the settings and the grid", parameters=(clash[0],))


def _passed(row: Mapping[str, Any], min_attainment: float) -> bool:
    value = row.get(ATTAINMENT_COLUMN)
    return value is not None and float(value) >= min_attainment


def tune(candidates: Sequence[Mapping[str, Any]], slos: Mapping[str, float],
         executor: Executor, *, store: SweepStore | None = None,
         min_attainment: float = DEFAULT_MIN_ATTAINMENT,
         options: SearchOptions | None = None, force: bool = False,
         progress: bool = False,
         on_probe: Callable[[dict[str, Any]], object] | None = None,
         slo_class: str | None = None,
         notes: Sequence[Mapping[str, Any]] | None = None,
         excluded: Sequence[str | None] | None = None) -> pd.DataFrame:
    """The ranked table: for each candidate (checked settings), the highest request rate
    whose goodput attainment is at least `min_attainment` under `slos` (ms keyed ttft, tpot,
    e2el), with its probe's metrics; best first. With `slo_class`, the attainment is over
    the requests of that SLO class only (a workload's `slo_class`: rank by its goodput).

    Candidates search in parallel on `executor`, one probe each in flight. Probes are
    appended to `store` when given, and a re-run takes the stored ones instead of simulating
    them again (`force`: simulates and replaces them). `on_probe(row)` sees each new probe.
    `notes[i]`: columns shown beside candidate i's settings (its quality figures);
    `excluded[i]`, when not None, says why candidate i is not searched (over a quality
    budget: `kvlab.sweep.quality`): it is ranked last with that status.
    """
    goodput = _checked_goodput(slos, min_attainment)
    check_candidates(candidates)
    options = options or SearchOptions()
    cached = _stored_probes(store) if store is not None and not force else {}
    measured = {"goodput": goodput, **({"slo_class": slo_class} if slo_class else {})}
    states = [_Candidate({**candidate, **measured}, options.search(),
                         notes=dict(notes[i]) if notes else {},
                         excluded=excluded[i] if excluded else None)
              for i, candidate in enumerate(candidates)]
    probing = _Probing(states, executor, cached, min_attainment, on_probe,
                       _bar(len(states), progress))
    try:
        probing.run()
    finally:
        if store is not None:
            if force:
                store.drop(row[KEY_COLUMN] for row in probing.new_rows)
            store.append(probing.new_rows)
        if probing.bar is not None:
            probing.bar.close()
    return ranked_table(states, min_attainment)


def _checked_goodput(slos: Mapping[str, float], min_attainment: float) -> dict[str, float]:
    """The SLOs in milliseconds (`parse_goodput`); a KvlabError for none or an attainment
    outside (0, 1]."""
    goodput = parse_goodput(f"{name}:{ms}" for name, ms in slos.items())
    if not goodput:
        raise KvlabError("tune needs at least one SLO, e.g. ttft:2000", parameters=("slo",))
    if not 0.0 < min_attainment <= 1.0:
        raise KvlabError(f"min_attainment {min_attainment!r}: expected a share in (0, 1]",
                         parameters=("min_attainment",))
    return goodput


@dataclass(slots=True)
class _Probing:
    """Every candidate's search at once on `executor`, one probe each in flight: stored
    probes (`cached`) are taken as they come, the others simulated; `new_rows` holds the
    simulated ones, in the order they finished."""

    states: Sequence[_Candidate]
    executor: Executor
    cached: dict[str, dict[str, Any]]
    min_attainment: float
    on_probe: Callable[[dict[str, Any]], object] | None
    bar: Any
    in_flight: dict[int, float] = field(default_factory=dict)
    new_rows: list[dict[str, Any]] = field(default_factory=list)

    def run(self) -> None:
        """Search every candidate until each is done."""
        for index in range(len(self.states)):
            self.advance(index)
        while self.in_flight:
            for index, row in self.executor.wait():
                rate = self.in_flight.pop(index)
                self.new_rows.append(row)
                if self.on_probe is not None:
                    self.on_probe(row)
                _take(self.states[index], rate, row, self.min_attainment)
                self.advance(index)

    def advance(self, index: int) -> None:
        """Take stored probes until one must be simulated, then submit it."""
        state = self.states[index]
        while state.error is None and state.excluded is None:
            rate = state.search.next_rate()
            if rate is None:
                break
            probe = {**state.settings, SEARCHED: rate}
            row = self.cached.get(run_key(probe))
            if row is None:
                self.executor.submit(index, probe)
                self.in_flight[index] = rate
                return
            _take(state, rate, row, self.min_attainment)
        if self.bar is not None:
            self.bar.update()


def _take(state: _Candidate, rate: float, row: Mapping[str, Any],
          min_attainment: float) -> None:
    if row.get("status") == "error":
        state.error = str(row.get(ERROR_COLUMN))
        return
    state.rows[rate] = dict(row)
    state.search.record(rate, _passed(row, min_attainment))


def _stored_probes(store: SweepStore) -> dict[str, dict[str, Any]]:
    frame = store.read()
    if frame.empty:
        return {}
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return {str(row[KEY_COLUMN]): row for row in rows}


def ranked_table(states: Sequence[_Candidate], min_attainment: float) -> pd.DataFrame:
    """One row per candidate, best (highest met rate) first; candidates that met no rate or
    failed to run next, in their order, then those over a quality budget."""
    import pandas as pd

    varying = _varying(state.settings for state in states)
    records = []
    for order, state in enumerate(states):
        search = state.search
        best = state.rows.get(search.passing) if search.passing is not None else None
        record: dict[str, Any] = {PARAM_PREFIX + name: state.settings.get(name)
                                  for name in varying}
        record.update(state.notes)
        record["max_request_rate"] = search.passing if state.error is None else None
        record["capped"] = search.capped
        record["lowest_failed_rate"] = search.failing
        for key in REPORTED:
            record[key] = None if best is None else best.get(key)
        record["num_probes"] = len(search.probes)
        record["min_attainment"] = min_attainment
        record["status"] = ("error" if state.error else f"over budget: {state.excluded}"
                            if state.excluded else "ok" if best else "no rate met")
        record["error"] = state.error
        record["_order"] = order + (len(states) if state.excluded else 0)  # (those last)
        records.append(record)
    table = pd.DataFrame(records)
    table["_rate"] = table["max_request_rate"].astype(float).fillna(-1.0)
    table = table.sort_values(["_rate", "_order"], ascending=[False, True], kind="stable")
    table.insert(0, "rank", range(1, len(table) + 1))
    return table.drop(columns=["_rate", "_order"]).reset_index(drop=True)


def _varying(settings: Any) -> list[str]:
    """The settings whose values differ between candidates (all of one candidate's when it is
    the only one)."""
    candidates = list(settings)
    names: dict[str, None] = {}
    for candidate in candidates:
        names.update(dict.fromkeys(candidate))
    names.pop("goodput", None)
    names.pop("slo_class", None)
    if len(candidates) == 1:
        return list(names)
    return [name for name in names
            if len({json.dumps(c.get(name), sort_keys=True, default=str)
                    for c in candidates}) > 1]


def save_table(table: pd.DataFrame, folder: str | Path, name: str = "tune") -> list[Path]:
    """The ranked table as NAME.parquet, NAME.csv and NAME.json (records) in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.parquet", folder / f"{name}.csv", folder / f"{name}.json"]
    table.to_parquet(paths[0], index=False)
    table.to_csv(paths[1], index=False)
    paths[2].write_text(table.to_json(orient="records", indent=1) + "\n", encoding="utf-8")
    return paths


def _bar(total: int, enabled: bool) -> Any:
    if not enabled or not total:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="candidate", desc="tune", dynamic_ncols=True)
