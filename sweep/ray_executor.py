"""The Ray executor: each point is one Ray task (one CPU), on a local Ray instance or an
existing cluster. Ray is imported here only, when this executor is chosen; every node of a
cluster needs the same kvlab installed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvlab.errors import KvlabError
from kvlab.sweep.runner import error_row, run_point

if TYPE_CHECKING:  # (executors imports this module when ray is chosen)
    from kvlab.sweep.executors import Finished

INSTALL_HINT = "pip install 'kvlab[sweep]' (or pip install ray)"


def import_ray() -> Any:
    """The `ray` module; a KvlabError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise KvlabError(f"executor ray needs Ray, which is not installed: {INSTALL_HINT}",
                         parameters=("executor",)) from None
    return ray


TASK_CPU_S = 1.0  # aim each Ray task at about this much CPU: many short runs share a task
MAX_CHUNK = 64


def run_chunk(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of several points, run one after the other in one Ray task."""
    return [run_point(point) for point in points]


class RayExecutor:
    """Runs points as Ray tasks. Connects to the cluster at `address` (`auto`: the one
    `ray start` runs on this machine; HOST:PORT: its head) or, without one, starts a local
    instance of `num_cpus` CPUs (default: every core) and stops it on `close`; an instance
    this process already started (`ray.init`) is used as it is.

    Short runs share a task, so that Ray's cost per task stays small next to the runs: the
    first tasks run one point each, later ones as many as take about TASK_CPU_S of CPU by the
    runs seen so far (at most MAX_CHUNK). A task whose worker dies (Ray retries it first)
    makes every point it held an error row.
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        ray = import_ray()
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            try:
                if address is None:
                    ray.init(num_cpus=num_cpus, include_dashboard=False,
                             logging_level="ERROR")
                else:
                    ray.init(address=address, logging_level="ERROR")
            except (ConnectionError, RuntimeError, ValueError) as err:
                where = f"the Ray cluster at {address}" if address else "a local Ray instance"
                message = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                raise KvlabError(f"cannot start or reach {where}: {message}",
                                 parameters=("address",)) from None
            self._started = True
        self._task = ray.remote(num_cpus=1)(run_chunk)
        self._cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
        self._refs: dict[Any, list[tuple[int, Mapping[str, Any]]]] = {}
        self._pending: list[tuple[int, Mapping[str, Any]]] = []
        self._num_rows, self._run_cpu_s = 0, 0.0

    @property
    def chunk(self) -> int:
        """Points per task: as many as take about TASK_CPU_S by the runs so far."""
        if not self._num_rows or self._run_cpu_s <= 0:
            return 1
        per_run = self._run_cpu_s / self._num_rows
        return max(1, min(MAX_CHUNK, round(TASK_CPU_S / per_run)))

    @property
    def slots(self) -> int:
        """Points to keep in flight: two tasks per CPU."""
        return 2 * self._cpus * self.chunk

    def submit(self, task_id: int, settings: Mapping[str, Any]) -> None:
        """Queue one point; a full chunk starts as a Ray task."""
        self._pending.append((task_id, settings))
        if len(self._pending) >= self.chunk:
            self._dispatch()

    def _dispatch(self, pieces: int = 1) -> None:
        """Start the queued points as `pieces` tasks of about equal size."""
        points, self._pending = self._pending, []
        size = -(-len(points) // max(1, min(pieces, len(points))))
        for start in range(0, len(points), size):
            chunk = points[start:start + size]
            self._refs[self._task.remote([dict(s) for _, s in chunk])] = chunk

    def wait(self) -> Finished:
        """The rows of the tasks that have finished (at least one)."""
        ray = self._ray
        if self._pending:  # fewer than a chunk: spread them over the CPUs
            self._dispatch(pieces=2 * self._cpus)
        pending = list(self._refs)
        ready, rest = ray.wait(pending, num_returns=1)
        if rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        finished: Finished = []
        for ref in ready:
            points = self._refs.pop(ref)
            try:
                rows = ray.get(ref)
            except ray.exceptions.RayError as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                rows = [error_row(settings, f"Ray task failed: {type(err).__name__}: {first}")
                        for _, settings in points]
            for (task_id, _), row in zip(points, rows, strict=True):
                self._num_rows += 1
                self._run_cpu_s += row.get("run_cpu_s") or 0.0
                finished.append((task_id, row))
        return finished

    def close(self) -> None:
        """Cancel the tasks still running (an interrupted sweep) and stop the local instance
        this executor started (a cluster keeps running)."""
        for ref in list(self._refs):
            self._ray.cancel(ref, force=True)
        self._refs.clear()
        if self._started:
            self._ray.shutdown()
            self._started = False
