"""Running a sweep: every point on an executor, rows appended to the store as they finish,
finished points skipped on a re-run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.sweep.executors import Executor
from kvlab.sweep.runner import STATUS_COLUMN
from kvlab.sweep.settings import run_key
from kvlab.sweep.store import SweepStore

FLUSH_S = 5.0  # at most this long between two parts of finished rows


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What a sweep did: points in the spec, runs skipped as already stored, runs done now and
    how many of them failed, the runs' own CPU seconds and the sweep's wall seconds."""

    num_points: int
    num_skipped: int
    num_run: int
    num_errors: int
    run_cpu_s: float
    wall_s: float


def run_points(points: Sequence[Mapping[str, Any]], executor: Executor,
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index into `points`, row) of every point as it finishes on `executor`, keeping
    `executor.slots` points in flight."""
    queue = iter(enumerate(points))
    in_flight = 0

    def fill() -> None:
        nonlocal in_flight
        while in_flight < executor.slots:
            item = next(queue, None)
            if item is None:
                return
            executor.submit(*item)
            in_flight += 1

    fill()
    while in_flight:
        for index, row in executor.wait():
            in_flight -= 1
            yield index, row
        fill()


def points_to_run(points: Sequence[Mapping[str, Any]], stored: Mapping[str, str], *,
                  force: bool = False, retry_failed: bool = False,
                  ) -> tuple[list[Mapping[str, Any]], set[str]]:
    """The points a sweep runs (in order, each once) and the stored keys it replaces: every
    point without a stored row; with `retry_failed`, those whose row is an error too; with
    `force`, all of them."""
    todo: list[Mapping[str, Any]] = []
    replaced: set[str] = set()
    seen: set[str] = set()
    for point in points:
        key = run_key(point)
        if key in seen:
            continue
        seen.add(key)
        status = stored.get(key)
        if status is None:
            todo.append(point)
        elif force or (retry_failed and status == "error"):
            todo.append(point)
            replaced.add(key)
    return todo, replaced


def run_sweep(points: Sequence[Mapping[str, Any]], store: SweepStore, executor: Executor, *,
              force: bool = False, retry_failed: bool = False, progress: bool = False,
              on_row: Callable[[dict[str, Any]], object] | None = None,
              flush_s: float = FLUSH_S) -> SweepReport:
    """Run the points not yet in `store` (see `points_to_run`) on `executor` and append their
    rows to it, a part every `flush_s` seconds and at the end (also when interrupted).

    `progress` draws a tqdm bar with the ETA on stderr; `on_row(row)` sees each row.
    """
    start = time.monotonic()
    todo, replaced = points_to_run(points, store.statuses(), force=force,
                                   retry_failed=retry_failed)
    store.drop(replaced)
    bar = _bar(len(todo), progress)
    buffer: list[dict[str, Any]] = []
    num_errors, run_cpu_s, last_flush = 0, 0.0, time.monotonic()
    try:
        for _, row in run_points(todo, executor):
            buffer.append(row)
            num_errors += row[STATUS_COLUMN] == "error"
            run_cpu_s += row.get("run_cpu_s") or 0.0
            if bar is not None:
                bar.update()
                if num_errors:
                    bar.set_postfix(errors=num_errors, refresh=False)
            if on_row is not None:
                on_row(row)
            if time.monotonic() - last_flush >= flush_s:
                store.append(buffer)
                buffer, last_flush = [], time.monotonic()
    finally:
        store.append(buffer)
        if bar is not None:
            bar.close()
    num_points = len({run_key(point) for point in points})
    return SweepReport(num_points, num_points - len(todo), len(todo), num_errors, run_cpu_s,
                       time.monotonic() - start)


def _bar(total: int, enabled: bool) -> Any:
    if not enabled or not total:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="run", desc="sweep", dynamic_ncols=True)
