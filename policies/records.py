"""Per-step records shared by the simulator and the engine (same columns in both worlds)."""

from __future__ import annotations

from array import array

from kvlab.policies.outputs import MemoryUsage, SchedulerOutput

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

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: dict[str, array] = {name: array("d") for name in FLOAT_COLUMNS}
        self.columns.update({name: array("q") for name in INT_COLUMNS})

    def __len__(self) -> int:
        return len(self.columns["step_id"])

    def record(
        self,
        output: SchedulerOutput,
        usage: MemoryUsage,
        *,
        start_s: float,
        duration_s: float,
        wall_time_s: float,
        num_running: int,
        num_waiting: int,
        num_swapped: int,
    ) -> None:
        """Append the row of one step."""
        c = self.columns
        ops = output.mem_ops
        c["start_s"].append(start_s)
        c["duration_s"].append(duration_s)
        c["wall_time_s"].append(wall_time_s)
        for name, value in (
            ("step_id", output.step_id),
            ("num_seqs", len(output.requests)),
            ("num_prefill_tokens", output.num_prefill_tokens),
            ("num_decode_tokens", output.num_decode_tokens),
            ("num_context_tokens", output.num_context_tokens),
            ("num_attention_pairs", output.num_attention_pairs),
            ("num_padded_context_tokens", output.num_padded_context_tokens),
            ("num_running", num_running),
            ("num_waiting", num_waiting),
            ("num_swapped", num_swapped),
            ("num_preempted", len(output.preempted)),
            ("num_swap_out_pages", len(ops.swap_outs)),
            ("num_swap_in_pages", len(ops.swap_ins)),
            ("num_swap_out_transfers", ops.num_swap_out_transfers),
            ("num_swap_in_transfers", ops.num_swap_in_transfers),
            ("num_copied_pages", len(ops.copies)),
            ("num_used_pages", usage.num_used_pages),
            ("num_cached_free_pages", usage.num_cached_free_pages),
            ("num_free_pages", usage.num_free_pages),
            ("num_live_token_slots", usage.num_live_token_slots),
            ("num_internal_frag_slots", usage.num_internal_frag_slots),
            ("num_external_frag_pages", usage.num_external_frag_pages),
            ("num_host_used_pages", usage.num_host_used_pages),
        ):
            c[name].append(value)

    def as_dict(self) -> dict[str, list]:
        """The columns as plain lists, in STEP_COLUMNS order (for pandas or JSON)."""
        return {name: self.columns[name].tolist() for name in STEP_COLUMNS}
