"""Per-step records, the same columns in both worlds: what the step loop appends each step."""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

# Columns of the per-step table, in order; the integer ones are stored as int64.
FLOAT_COLUMNS = ("start_s", "duration_s", "wall_time_s")


class StepCounts(NamedTuple):
    """One step's integer columns, by name: what it ran, the queues, the memory work, and
    the memory after its decisions (`StepRecorder.append`)."""

    step_id: int
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_context_tokens: int
    num_attention_pairs: int
    num_padded_context_tokens: int
    num_running: int
    num_waiting: int
    num_swapped: int
    num_preempted: int
    num_swap_out_pages: int
    num_swap_in_pages: int
    num_swap_out_transfers: int
    num_swap_in_transfers: int
    num_copied_pages: int
    num_used_pages: int
    num_cached_free_pages: int
    num_free_pages: int
    num_live_token_slots: int
    num_internal_frag_slots: int
    num_external_frag_pages: int
    num_host_used_pages: int


INT_COLUMNS = StepCounts._fields
STEP_COLUMNS = ("step_id", *FLOAT_COLUMNS, *INT_COLUMNS[1:])

# Runs an iterator to its end in C: the per-column appends of a step are one `map` (a row is
# 26 columns, and the simulator records ~100k rows a run).
_run: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend


class StepRecorder:
    """Collects one row per engine step into compact columns (array-backed, cheap to append).

    `wall_time_s` is the measured duration in the engine and equals `duration_s` in the simulator.
    Memory columns are the state after the step's decisions, before its tokens are committed.
    A run may add integer columns of its own after STEP_COLUMNS, a value per step
    (`add_columns`: a precision policy's mix, policies/precision/mix.py).
    """

    __slots__ = ("_ints", "columns")

    def __init__(self) -> None:
        self.columns: dict[str, array] = {name: array("d") for name in FLOAT_COLUMNS}
        self.columns.update({name: array("q") for name in INT_COLUMNS})
        self._ints = [self.columns[name] for name in INT_COLUMNS]

    def __len__(self) -> int:
        return len(self.columns["step_id"])

    def append(self, start_s: float, duration_s: float, wall_time_s: float,
               counts: StepCounts) -> None:
        """Append one step's row: its times and its counts."""
        columns = self.columns
        columns["start_s"].append(start_s)
        columns["duration_s"].append(duration_s)
        columns["wall_time_s"].append(wall_time_s)
        _run(map(array.append, self._ints, counts))

    def extend_columns(self, starts_s: list[float], durations_s: list[float],
                       counts: Mapping[str, list[int]]) -> None:
        """Append rows given by column: their start times, durations (the wall times too, as
        the simulator records them) and each `StepCounts` field by name, lists as long as
        `starts_s`."""
        assert counts.keys() == set(INT_COLUMNS), "one list per StepCounts field"
        columns = self.columns
        columns["start_s"].fromlist(starts_s)
        columns["duration_s"].fromlist(durations_s)
        columns["wall_time_s"].fromlist(durations_s)
        _run(map(array.fromlist, self._ints, map(counts.__getitem__, INT_COLUMNS)))

    def extend(self, other: StepRecorder) -> None:
        """Append every row of another recorder. An added column (`add_columns`) stays only
        where both have it (a recorder without rows takes the other's): the rows of a run
        without it would have no value."""
        columns = self.columns
        if not len(self):
            for name in other.added_columns():
                columns.setdefault(name, array(other.columns[name].typecode))
        for name in [name for name in self.added_columns() if name not in other.columns]:
            del columns[name]
        for name, column in columns.items():
            column.extend(other.columns[name])

    def clear(self) -> None:
        """Drop every row (a server that keeps no profile bounds its memory so)."""
        for column in self.columns.values():
            del column[:]

    def add_columns(self, added: Mapping[str, array]) -> None:
        """Columns of a run's own after STEP_COLUMNS, one value per step recorded: integers,
        but for a float array (`array("d")`)."""
        for name, values in added.items():
            if name in STEP_COLUMNS or len(values) != len(self):
                raise ValueError(f"step column {name!r}: {len(values)} values for "
                                 f"{len(self)} steps, or a name STEP_COLUMNS has")
            kind = "d" if isinstance(values, array) and values.typecode == "d" else "q"
            self.columns[name] = array(kind, values)

    def added_columns(self) -> list[str]:
        """The columns `add_columns` added, in order."""
        return list(self.columns)[len(STEP_COLUMNS):]

    def column_names(self) -> tuple[str, ...]:
        """Every column: STEP_COLUMNS, then those added."""
        return (*STEP_COLUMNS, *self.added_columns())

    def ordered_columns(self) -> dict[str, array]:
        """The columns as they are (no copies), STEP_COLUMNS first."""
        return {name: self.columns[name] for name in self.column_names()}

    def as_dict(self) -> dict[str, list]:
        """The columns as plain lists, STEP_COLUMNS first (for pandas or JSON)."""
        return {name: column.tolist() for name, column in self.ordered_columns().items()}
