"""What a simulated cluster leaves behind: `ClusterResult` (one RunResult per instance and one
for the whole cluster), its summary and its tables with an instance column."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.metrics import RunResult, per_request_table, per_step_table, summarize

if TYPE_CHECKING:
    import pandas as pd

@dataclass(slots=True)
class ClusterResult:
    """The records of one cluster run.

    `cluster` holds every request of the trace (in trace order), every instance's steps (instance
    by instance) and inter-token gaps, and a duration from the first arrival to the last finish;
    its KV-memory fields are one instance's (every instance has the same memory), so its KV
    metrics are per instance: a mean over all instances' steps, a peak of any instance.
    `instances[i]` is instance i's run: the requests routed to it. `instance_of` maps each
    request id to the instance it was routed to.
    """

    cluster: RunResult
    instances: list[RunResult]
    instance_of: dict[int, int]
    roles: list[str]
    router: str
    router_seed: int

    @property
    def num_instances(self) -> int:
        """Instances in the cluster."""
        return len(self.instances)


def summarize_cluster(result: ClusterResult, **options: Any) -> dict[str, Any]:
    """The cluster's summary (`summarize` of the whole run, `options` passed on: it records
    num_instances, router and router_seed) with an `instances` list: each instance's summary,
    its `instance` index and `role` first."""
    summary = summarize(result.cluster, **options)
    summary["instances"] = instance_summaries(result, **options)
    return summary


def instance_summaries(result: ClusterResult, **options: Any) -> list[dict[str, Any]]:
    """One summary per instance, in index order, each starting with `instance` and `role`.
    Under prefill/decode disaggregation a request runs on two instances: a prefill instance's
    output is each request's first token, a decode instance's the rest (so the instances'
    tokens add up to the cluster's, not twice them)."""
    summaries = []
    for index, (run, role) in enumerate(zip(result.instances, result.roles, strict=True)):
        summary = {"instance": index, "role": role, **summarize(run, **options)}
        if role in ("prefill", "decode"):
            _split_output(summary, first_tokens=role == "prefill")
        summaries.append(summary)
    return summaries


def _split_output(summary: dict[str, Any], *, first_tokens: bool) -> None:
    """A prefill (`first_tokens`) or decode instance's share of its requests' output tokens
    and the throughputs made of them: one first token per completed request, or the rest."""
    num_first = summary["completed"]
    output = num_first if first_tokens else summary["total_output_tokens"] - num_first
    inputs = summary["total_input_tokens"] if first_tokens else 0  # (decode gets the KV)
    duration = summary["duration"]
    summary["total_output_tokens"] = output
    summary["output_throughput"] = output / duration if duration > 0 else 0.0
    summary["total_token_throughput"] = (inputs + output) / duration if duration > 0 else 0.0


def cluster_request_table(result: ClusterResult) -> pd.DataFrame:
    """One row per request (`per_request_table` of the whole run) with the `instance` it was
    routed to, after its id."""
    table = per_request_table(result.cluster)
    instance_of = result.instance_of
    table.insert(1, "instance", [instance_of[int(rid)] for rid in table["request_id"]])
    return table


def cluster_step_table(result: ClusterResult) -> pd.DataFrame:
    """One row per engine step of every instance, instance by instance, with its `instance`
    first (step ids count per instance)."""
    import pandas as pd

    tables = []
    for index, run in enumerate(result.instances):
        table = per_step_table(run)
        table.insert(0, "instance", index)
        tables.append(table)
    return pd.concat(tables, ignore_index=True)
