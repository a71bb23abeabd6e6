"""Who holds each KV page at one engine step: the simulation re-run up to that step.

The simulator records per-step counts, not per-page state, so the map replays the same trace and
config up to the middle of the chosen step and reads the manager's block tables (pages of every
sequence holding memory) and its evictor (cached prefix pages).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from kvlab.sim import SimConfig, Simulation
from kvlab.traces import Trace

# Page owner codes below 0; a request id (>= 0) means the page is used by that request alone.
FREE = -1
CACHED = -2
SHARED = -3


@dataclass(slots=True)
class PageMap:
    """The state of every page at one step: `owners[p]` is a request id, FREE, CACHED or SHARED.

    `num_used_pages` counts pages held by at least one sequence (as the step table does).
    """

    step_id: int
    time_s: float
    page_size: int
    owners: np.ndarray

    @property
    def num_used_pages(self) -> int:
        """Pages held by one sequence or shared by several."""
        return int(np.count_nonzero((self.owners >= 0) | (self.owners == SHARED)))

    @property
    def num_cached_pages(self) -> int:
        """Unreferenced pages that still hold a cached prefix."""
        return int(np.count_nonzero(self.owners == CACHED))

    def cells(self, max_cells: int) -> tuple[np.ndarray, int]:
        """Owner codes of at most `max_cells` cells and the pages per cell; a cell standing for
        several pages takes the owner most of them have (ties: the first page's)."""
        num_pages = len(self.owners)
        per_cell = max(1, -(-num_pages // max_cells))
        if per_cell == 1:
            return self.owners, 1
        cells = [Counter(self.owners[i:i + per_cell].tolist()).most_common(1)[0][0]
                 for i in range(0, num_pages, per_cell)]
        return np.array(cells, dtype=np.int64), per_cell


def page_map_at(trace: Trace, config: SimConfig, step_id: int, start_s: float,
                duration_s: float) -> PageMap:
    """Replay `trace` under `config` to the middle of step `step_id` (started at `start_s`,
    lasting `duration_s`) and return who holds each page then.

    Memory then is the state after that step's decisions, the same moment the step table records
    (every step stepped: the fast path commits a run of steps only at its end).
    """
    sim = Simulation(trace, config, decode_runs=False)
    env, instance = sim.env, sim.instance
    env.process(instance.run())
    env.run(until=start_s + max(duration_s, 1e-12) / 2)
    manager = sim.manager
    owners = np.full(manager.num_total_pages, FREE, dtype=np.int64)
    for request in sim.requests:
        for page in manager.block_table(request):
            owners[page] = request.request_id if owners[page] == FREE else SHARED
    owners[manager.evictor.pages()] = CACHED
    return PageMap(step_id=step_id, time_s=start_s, page_size=manager.page_size, owners=owners)
