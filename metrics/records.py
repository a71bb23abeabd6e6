"""Per-step records, the same columns in both worlds: what the step loop appends each step."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

# Columns of the per-step table, in order; the integer ones are stored as int64.
FLOAT_COLUMNS = ("start_s", "duration_s", "wall_time_s")
INT_COLUMNS = (
    "step_id",
    "num_seqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_context_tokens",
    "num_attention_pairs",
    "num_padded_context_tokens",
    "num_running",
    "num_waiting",
    "num_swapped",
    "num_preempted",
    "num_swap_out_pages",
    "num_swap_in_pages",
    "num_swap_out_transfers",
    "num_swap_in_transfers",
    "num_copied_pages",
    "num_used_pages",
    "num_cached_free_pages",
    "num_free_pages",
    "num_live_token_slots",
    "num_internal_frag_slots",
    "num_external_frag_pages",
    "num_host_used_pages",
)
STEP_COLUMNS = ("step_id", *FLOAT_COLUMNS, *INT_COLUMNS[1:])


class StepRecorder:
    """Collects one row per engine step into compact columns (array-backed, cheap to append).

    `wall_time_s` is the measured duration in the engine and equals `duration_s` in the simulator.
    Memory columns are the state after the step's decisions, before its tokens are committed.
    """

    __slots__ = ("_ints", "columns")

    def __init__(self) -> None:
        self.columns: dict[str, array] = {name: array("d") for name in FLOAT_COLUMNS}
        self.columns.update({name: array("q") for name in INT_COLUMNS})
        self._ints = [self.columns[name] for name in INT_COLUMNS]

    def __len__(self) -> int:
        return len(self.columns["step_id"])

    def append(
        self, start_s: float, duration_s: float, wall_time_s: float, ints: Sequence[int]
    ) -> None:
        """Append one step's row: its times, then its `INT_COLUMNS` values in that order."""
        columns = self.columns
        columns["start_s"].append(start_s)
        columns["duration_s"].append(duration_s)
        columns["wall_time_s"].append(wall_time_s)
        for column, value in zip(self._ints, ints, strict=True):
            column.append(value)

    def extend_columns(self, starts_s: list[float], durations_s: list[float],
                       ints: Sequence[Sequence[int] | int]) -> None:
        """Append rows given by column: their start times, durations (the wall times too, as
        the simulator records them) and each of `INT_COLUMNS`, in that order, as a sequence or
        as one int that every row shares."""
        columns = self.columns
        columns["start_s"].fromlist(starts_s)
        columns["duration_s"].fromlist(durations_s)
        columns["wall_time_s"].fromlist(durations_s)
        num_rows = len(starts_s)
        # fromlist converts a list in C; extend goes through the iterator protocol (twice as
        # slow on the short runs the simulator commits)
        for column, values in zip(self._ints, ints, strict=True):
            if values.__class__ is int:
                column.fromlist([values] * num_rows)
            elif values.__class__ is list:
                column.fromlist(values)  # type: ignore[arg-type]
            else:
                column.extend(values)  # type: ignore[arg-type]

    def extend(self, other: StepRecorder) -> None:
        """Append every row of another recorder."""
        for name, column in other.columns.items():
            self.columns[name].extend(column)

    def as_dict(self) -> dict[str, list]:
        """The columns as plain lists, in STEP_COLUMNS order (for pandas or JSON)."""
        return {name: self.columns[name].tolist() for name in STEP_COLUMNS}
