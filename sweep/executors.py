"""Where a sweep's runs execute: in this process, on a local process pool, or on Ray
(`kvlab.sweep.ray_executor`). Each executor runs `kvlab.sweep.runner.run_point` on settings
and hands back rows as they finish, in any order."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from kvlab.errors import KvlabError
from kvlab.sweep.runner import error_row, run_point

EXECUTORS = ("local", "ray")
Finished = list[tuple[int, dict[str, Any]]]


class Executor(Protocol):
    """Runs points and returns their rows: `submit` a point under a task id, `wait` for at
    least one finished row. `slots` is how many points to keep in flight to keep every worker
    busy."""

    @property
    def slots(self) -> int:
        """Points to keep in flight."""

    def submit(self, task_id: int, settings: Mapping[str, Any]) -> None:
        """Start running one point."""

    def wait(self) -> Finished:
        """Block until at least one submitted point has finished; (task id, row) of each
        finished one. Only call with points in flight."""

    def close(self) -> None:
        """Stop the workers (those this executor started)."""


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class SerialExecutor:
    """Runs each point in this process when waited for (one worker; the dashboard's)."""

    slots = 1

    def __init__(self) -> None:
        self._queue: deque[tuple[int, Mapping[str, Any]]] = deque()

    def submit(self, task_id: int, settings: Mapping[str, Any]) -> None:
        """Queue one point."""
        self._queue.append((task_id, settings))

    def wait(self) -> Finished:
        """Run the oldest queued point."""
        task_id, settings = self._queue.popleft()
        return [(task_id, run_point(settings))]

    def close(self) -> None:
        """Nothing runs in the background."""


class PoolExecutor:
    """A pool of `workers` processes on this machine. Workers fork from this process where
    the platform can (they start with kvlab imported). A worker that dies (killed, out of
    memory) fails the points the pool was running: they become error rows, and a new pool
    runs the rest."""

    def __init__(self, workers: int | None = None) -> None:
        workers = default_workers() if workers is None else workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise KvlabError(f"workers {workers!r}: expected a whole number >= 1",
                             parameters=("workers",))
        self.workers = workers
        self.slots = 2 * workers
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[Future[dict[str, Any]],
                            tuple[int, Mapping[str, Any], ProcessPoolExecutor]] = {}

    def _start(self) -> ProcessPoolExecutor:
        import multiprocessing

        if self._pool is None:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else None)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context,
                                             initializer=_ignore_interrupts)
        return self._pool

    def submit(self, task_id: int, settings: Mapping[str, Any]) -> None:
        """Send one point to the pool."""
        pool = self._start()
        try:
            future = pool.submit(run_point, dict(settings))
        except BrokenProcessPool:  # a worker died since the last wait
            self._discard(pool)
            pool = self._start()
            future = pool.submit(run_point, dict(settings))
        self._futures[future] = (task_id, settings, pool)

    def wait(self) -> Finished:
        """The rows of the points that have finished (at least one)."""
        done, _ = wait(list(self._futures), return_when=FIRST_COMPLETED)
        finished: Finished = []
        for future in done:
            task_id, settings, pool = self._futures.pop(future)
            try:
                row = future.result()
            except BrokenProcessPool as err:
                row = error_row(settings, f"worker process died while the pool ran this run "
                                f"({err or 'BrokenProcessPool'}); rerun with --retry-failed")
                self._discard(pool)
            finished.append((task_id, row))
        return finished

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """Drop a broken pool (the next submit starts a new one)."""
        pool.shutdown(wait=False, cancel_futures=True)
        if self._pool is pool:
            self._pool = None

    def close(self) -> None:
        """Stop the workers: idle ones exit; with points still running (an interrupted
        sweep), the workers are terminated."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if any(not future.done() for future in self._futures):
            # the executor's own list of its processes: there is no public way to stop them
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        self._futures.clear()


def _ignore_interrupts() -> None:
    """In a pool worker: leave Ctrl-C to the sweep's process, which stops the workers."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_executor(name: str = "local", *, workers: int | None = None,
                  address: str | None = None) -> Executor:
    """The executor called `name`: `local` (a process pool of `workers`, default one per
    core; one worker runs in this process) or `ray` (Ray tasks on the cluster at `address`,
    `auto` for the running one; without an address, a local Ray instance of `workers` CPUs)."""
    if name not in EXECUTORS:
        raise KvlabError(f"executor {name!r}: expected one of {', '.join(EXECUTORS)}",
                         parameters=("executor",))
    if name == "ray":
        from kvlab.sweep.ray_executor import RayExecutor

        return RayExecutor(address=address, num_cpus=workers)
    if address is not None:
        raise KvlabError("address is for the ray executor; the local one runs on this machine",
                         parameters=("address",))
    if workers == 1:
        return SerialExecutor()
    return PoolExecutor(workers)
