"""The KV lockstep's comparison: the server's and kvlab's prefix-cache changes aligned in order
(longest matching subsequence), the first place they part, and the cause of every change left
unmatched (`WHY`), in a `KVLockstepReport`.
"""

from __future__ import annotations

import dataclasses
import difflib
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvlab.fidelity.kv_changes import Change

if TYPE_CHECKING:
    from kvlab.fidelity.step_log import ScheduleMatch

# Why an event has no partner on the other side (the report's explanations).
WHY = {
    "moved": "the other side made the same change at another point of the sequence (a step "
             "boundary the client saw differently, or a different preemption)",
    "duplicate": "the server cached a second copy of content it already held (two requests "
                 "computed the same block in one step; kvlab keeps one copy)",
    "unknown": "a block the subscription never saw stored (the server cached it before the "
               "run began: reset its cache first, --reset-prefix-cache)",
    "sparse": "a block of a run the server cached sparsely (its BlockStored names fewer "
              "blocks than its tokens fill, so which block each name is stays unknown: "
              "vLLM's prefix_cache_retention_interval, default 0 in 0.32, which kvlab "
              "replays as the server exports it; compare the stored and removed counts, or "
              "start vLLM with --prefix-cache-retention-interval None for block by block)",
    "server-only": "only the server made this change",
    "kvlab-only": "only kvlab made this change (for a stored block: the server may have held "
                  "it cached from before the run)",
}



@dataclass(slots=True)
class KVLockstepReport:
    """How the server's and kvlab's prefix-cache changes line up.

    `match_rate` is the share of changes matched in order, over the longer of the two
    sequences; `first_divergence` describes the first place they part; `unmatched` counts the
    changes left without a partner by cause (`WHY`).
    """

    num_server: int
    num_kvlab: int
    num_matched: int
    server_counts: dict[str, int]
    kvlab_counts: dict[str, int]
    unmatched: dict[str, int] = field(default_factory=dict)
    first_divergence: dict[str, Any] | None = None
    moved_median_s: float | None = None  # how far apart a moved change's two sides are
    num_replay_steps: int = 0
    num_server_batches: int = 0
    num_server_preemptions: int | None = None  # the server's counter, when it exports one
    num_kvlab_preemptions: int = 0
    # kvlab's steps against the server's, where its scheduler's log was given
    schedule: ScheduleMatch | None = None

    @property
    def match_rate(self) -> float:
        """Matched changes over the longer sequence (1.0 when both are empty)."""
        longest = max(self.num_server, self.num_kvlab)
        return self.num_matched / longest if longest else 1.0

    @property
    def identical(self) -> bool:
        """Every change matched, in order."""
        return self.num_matched == self.num_server == self.num_kvlab

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields, the match rate and the causes' meanings included."""
        document = dataclasses.asdict(self)
        document.update(match_rate=self.match_rate, identical=self.identical,
                        causes={cause: WHY[cause] for cause in self.unmatched})
        if self.schedule is not None:
            document["schedule"]["identical"] = self.schedule.identical
        return document


def compare_changes(server: list[Change], kvlab: list[Change]) -> KVLockstepReport:
    """Align the two sequences of changes and report the matches, the first divergence and
    the cause of every unmatched change."""
    server_seq = [c.item for c in server]
    kvlab_seq = [c.item for c in kvlab]
    matcher = difflib.SequenceMatcher(None, server_seq, kvlab_seq, autojunk=False)
    blocks = matcher.get_matching_blocks()
    matched_server: set[int] = set()
    matched_kvlab: set[int] = set()
    for block in blocks:
        matched_server.update(range(block.a, block.a + block.size))
        matched_kvlab.update(range(block.b, block.b + block.size))
    report = KVLockstepReport(
        num_server=len(server), num_kvlab=len(kvlab),
        num_matched=sum(block.size for block in blocks),
        server_counts=dict(Counter(c.kind for c in server)),
        kvlab_counts=dict(Counter(c.kind for c in kvlab)),
    )
    left_server = Counter(s for i, s in enumerate(server_seq) if i not in matched_server)
    left_kvlab: Counter[tuple[str, int, int | None]] = Counter(
        k for j, k in enumerate(kvlab_seq) if j not in matched_kvlab)
    causes: Counter[str] = Counter()
    for i, change in enumerate(server):
        if i not in matched_server:
            causes[_server_cause(change, left_kvlab)] += 1
    for j, item in enumerate(kvlab_seq):
        if j not in matched_kvlab:
            causes["moved" if left_server[item] else "kvlab-only"] += 1
    report.unmatched = dict(causes)
    report.moved_median_s = _moved_median_s(
        [c for i, c in enumerate(server) if i not in matched_server],
        [c for j, c in enumerate(kvlab) if j not in matched_kvlab])
    report.first_divergence = _first_divergence(matcher, server, kvlab)
    return report


def _moved_median_s(server: list[Change], kvlab: list[Change]) -> float | None:
    """The median time between the two sides of a change each made elsewhere (paired in
    order), None when there is none."""
    times: dict[tuple[str, int, int | None], list[float]] = {}
    for change in kvlab:
        times.setdefault(change.item, []).append(change.time_s)
    gaps = []
    for change in server:
        other = times.get(change.item)
        if other:
            gaps.append(abs(other.pop(0) - change.time_s))
    return float(statistics.median(gaps)) if gaps else None


def _server_cause(change: Change, left_kvlab: Counter) -> str:
    if change.key is None:
        return "sparse" if change.sparse else "unknown"
    if change.duplicate:
        return "duplicate"
    return "moved" if left_kvlab[change.item] else "server-only"


def _first_divergence(matcher: difflib.SequenceMatcher, server: list[Change],
                      kvlab: list[Change]) -> dict[str, Any] | None:
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        return {"server_index": i1, "kvlab_index": j1,
                "server": _describe(server[i1:i2][:3]), "kvlab": _describe(kvlab[j1:j2][:3]),
                "num_server": i2 - i1, "num_kvlab": j2 - j1}
    return None


def _describe(changes: list[Change]) -> list[dict[str, Any]]:
    return [{"kind": c.kind, "key": None if c.key is None else f"{c.key:016x}",
             "group": c.group, "step": c.step, "time_s": round(c.time_s, 6),
             "request_id": c.request_id} for c in changes]
