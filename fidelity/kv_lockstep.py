"""KV lockstep against a server: kvlab's manager replays a benchmark's requests and its
prefix-cache changes are compared, block by block and in order, with the KV events the server
published during the run (vLLM's BlockStored / BlockRemoved); this module runs the three steps
and writes the report's text.

The steps, one room each: the server's events as changes keyed by content (`kv_changes`: the two
sides hash differently), kvlab's replay of the same requests on the server's configuration and
timeline (`kv_replay`), and the two sequences aligned in order, every change left unmatched
classified so the report says why (`kv_alignment`).

A model with several KV-cache groups (sliding-window layers: vLLM's hybrid KV cache manager)
caches blocks per group: a change is a (kind, group, content key) on both sides, the server's
group its events' `group_idx` (vLLM 0.32; 0 where a server sends none), kvlab's its events'
`group` (`kvlab.policies.kv_events`). Groups are numbered in vLLM's order on both sides
(`kvlab.specs.kv_layout.kv_cache_groups`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from kvlab.bench.observed import series_increase
from kvlab.errors import KvlabError
from kvlab.fidelity.kv_alignment import WHY, KVLockstepReport, compare_changes
from kvlab.fidelity.kv_changes import Change, server_changes
from kvlab.fidelity.kv_replay import publishes_every_step, replay_changes, server_step_ends
from kvlab.policies.kv_events import CLEARED, REMOVED, STORED

if TYPE_CHECKING:
    from kvlab.bench import BenchResult
    from kvlab.fidelity.step_log import ScheduleLog, ScheduleMatch
    from kvlab.sim import SimConfig


def kv_lockstep(result: BenchResult, config: SimConfig, step_log: ScheduleLog | None = None
                ) -> KVLockstepReport:
    """Replay the bench's requests through kvlab's manager on `config` (the server's
    configuration, e.g. `server_sim_config(info, model, preset="vllm")`) and compare its
    prefix-cache changes with the server's KV events (`result.kv_events`). With `step_log`
    (vLLM's scheduler log of the run: `kvlab.fidelity.step_log`) the replay takes vLLM's own
    steps and arrivals on its engine clock; without, the steps the client saw stream back."""
    if result.kv_events is None:
        raise KvlabError("the bench result has no KV event stream: run `kvlab bench serve` "
                         "with --kv-events", parameters=("kv_events",))
    server = server_changes(result.kv_events)
    while server and server[0].kind == CLEARED:  # a reset before the run: kvlab starts empty too
        server.pop(0)
    schedule = None
    if step_log is None:
        ends = server_step_ends(result)
        if publishes_every_step(result):  # a change happened at its batch's step end, exactly
            server = [dataclasses.replace(c, time_s=ends[c.step]) for c in server]
        replay = replay_changes(result, config, server, ends)
    else:
        from kvlab.fidelity.step_log import bench_on_engine_clock, match_schedule

        run = bench_on_engine_clock(result, step_log, config)
        replay, schedule = run.as_replay(), match_schedule(run, step_log)
    owners = _block_owners(replay.changes)  # names the server's blocks by who stored them
    server = [dataclasses.replace(c, request_id=owners.get(c.key)) for c in server]
    report = compare_changes(server, replay.changes)
    report.schedule = schedule
    report.num_replay_steps = replay.num_steps
    report.num_kvlab_preemptions = replay.num_preemptions
    report.num_server_batches = len(result.kv_events.batches)
    preemptions = series_increase(result.series, "num_preemptions_total")
    report.num_server_preemptions = None if preemptions is None else int(preemptions)
    return report


def _block_owners(changes: list[Change]) -> dict[int | None, int | None]:
    """Content key -> the request that first stored it (kvlab side): names the server's
    blocks in the report."""
    owners: dict[int | None, int | None] = {}
    for change in changes:
        if change.kind == STORED:
            owners.setdefault(change.key, change.request_id)
    return owners


def format_kv_lockstep(report: KVLockstepReport) -> str:
    """The report's text section."""
    def counts(values: dict[str, int]) -> str:
        return ", ".join(f"{values.get(kind, 0)} {kind}" for kind in (STORED, REMOVED))

    lines = [
        f"{' KV lockstep (server events vs kvlab) ':=^50}",
        f"{'Server block changes:':<40} {report.num_server:<10} ({counts(report.server_counts)})",
        f"{'kvlab block changes:':<40} {report.num_kvlab:<10} ({counts(report.kvlab_counts)})",
        f"{'Matched in order:':<40} {report.num_matched:<10}",
        f"{'Match rate (%):':<40} {100 * report.match_rate:<10.2f}",
        f"{'Server batches / kvlab steps:':<40} {report.num_server_batches} / "
        f"{report.num_replay_steps}",
        f"{'Preemptions server / kvlab:':<40} "
        f"{'?' if report.num_server_preemptions is None else report.num_server_preemptions}"
        f" / {report.num_kvlab_preemptions}",
    ]
    for cause, number in sorted(report.unmatched.items(), key=lambda kv: -kv[1]):
        apart = (f"; median {report.moved_median_s * 1e3:.1f} ms apart"
                 if cause == "moved" and report.moved_median_s is not None else "")
        lines.append(f"  unmatched, {cause}: {number} ({WHY[cause]}{apart})")
    if report.schedule is not None:
        lines += _schedule_lines(report.schedule)
    first = report.first_divergence
    if first is None:
        lines.append("Every block change matched, in order.")
    else:
        lines.append(f"First divergence at server change {first['server_index']}, kvlab change "
                     f"{first['kvlab_index']}:")
        lines.append("  server: " + _line(first["server"], first["num_server"], "batch"))
        lines.append("  kvlab:  " + _line(first["kvlab"], first["num_kvlab"], "step"))
    return "\n".join(lines)


def _schedule_lines(schedule: ScheduleMatch) -> list[str]:
    """The steps on vLLM's clock against vLLM's (`--step-log`)."""
    same = schedule.first_difference if schedule.first_difference is not None else min(
        schedule.num_vllm_steps, schedule.num_kvlab_steps)
    lines = [f"{'Steps vLLM / kvlab (its clock):':<40} {schedule.num_vllm_steps} / "
             f"{schedule.num_kvlab_steps}",
             f"{'Steps alike before the first other:':<40} {same}"
             + ("" if schedule.first_difference is None else
                f" (step {schedule.first_difference} differs)"),
             f"{'Preemptions per request alike:':<40} "
             f"{'yes' if schedule.preemptions_equal else 'no'} "
             f"({schedule.num_vllm_preemptions} / {schedule.num_kvlab_preemptions})"]
    if schedule.identical:
        lines.append("Every step scheduled as vLLM's, every preemption too.")
    return lines


def _line(changes: list[dict[str, Any]], total: int, unit: str) -> str:
    if not changes:
        return "nothing here"
    text = "; ".join(
        f"{c['kind']} block {c['key'] or '?'}{_group_label(c)} (request {c['request_id']}, "
        f"{unit} {c['step']}, t={c['time_s']:.3f}s)" for c in changes)
    return text + (f"; ... {total} in all" if total > len(changes) else "")


def _group_label(change: dict[str, Any]) -> str:
    """` in group G` for a block of a group other than the first (a hybrid model's)."""
    group = change.get("group", 0)
    return f" in group {group}" if group else ""
