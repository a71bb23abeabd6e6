"""The Ray executor: each point is one Ray task (one CPU), on a local Ray instance or an
existing cluster. Ray is imported here only, when this executor is chosen; every node of a
cluster needs the same kvlab installed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvlab.errors import KvlabError
from kvlab.sweep.executors import Finished
from kvlab.sweep.runner import error_row, run_point

INSTALL_HINT = "pip install 'kvlab[sweep]' (or pip install ray)"


def import_ray() -> Any:
    """The `ray` module; a KvlabError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise KvlabError(f"executor ray needs Ray, which is not installed: {INSTALL_HINT}",
                         parameters=("executor",)) from None
    return ray


class RayExecutor:
    """Runs points as Ray tasks. Connects to the cluster at `address` (`auto`: the one
    `ray start` runs on this machine; HOST:PORT: its head) or, without one, starts a local
    instance of `num_cpus` CPUs (default: every core) and stops it on `close`; an instance
    this process already started (`ray.init`) is used as it is."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        ray = import_ray()
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            try:
                if address is None:
                    ray.init(num_cpus=num_cpus, include_dashboard=False,
                             logging_level="WARNING")
                else:
                    ray.init(address=address, logging_level="WARNING")
            except (ConnectionError, RuntimeError, ValueError) as err:
                where = f"the Ray cluster at {address}" if address else "a local Ray instance"
                message = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                raise KvlabError(f"cannot start or reach {where}: {message}",
                                 parameters=("address",)) from None
            self._started = True
        self._task = ray.remote(num_cpus=1)(run_point)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = 2 * max(cpus, 1)
        self._refs: dict[Any, tuple[int, Mapping[str, Any]]] = {}

    def submit(self, task_id: int, settings: Mapping[str, Any]) -> None:
        """Start one point as a Ray task."""
        self._refs[self._task.remote(dict(settings))] = (task_id, settings)

    def wait(self) -> Finished:
        """The rows of the tasks that have finished (at least one)."""
        ray = self._ray
        pending = list(self._refs)
        ready, rest = ray.wait(pending, num_returns=1)
        if rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        finished: Finished = []
        for ref in ready:
            task_id, settings = self._refs.pop(ref)
            try:
                row = ray.get(ref)
            except ray.exceptions.RayError as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                row = error_row(settings, f"Ray task failed: {type(err).__name__}: {first}")
            finished.append((task_id, row))
        return finished

    def close(self) -> None:
        """Stop the local instance this executor started (a cluster keeps running)."""
        if self._started:
            self._ray.shutdown()
            self._started = False
