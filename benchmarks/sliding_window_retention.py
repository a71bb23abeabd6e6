"""Sliding-window prefix hits against the retention interval
(docs/experiments/sliding_window_retention.md): one synthetic trace of shared prefixes through a
sliding-window model with prefix caching, for each KV memory size, under full attention
(`--disable-hybrid-kv-cache-manager`) and under the hybrid manager at each
`--prefix-cache-retention-interval`. Prints a Markdown table; writes every run's numbers as CSV
and, with plotly installed, a figure of hit rate and mean TTFT against KV memory as HTML.

    .venv/bin/python benchmarks/sliding_window_retention.py [--model gpt-oss-20b] \
        [--hardware h100] [--memories 2,3,4,6,8] [--intervals 0,512,2048,8192] \
        [--prefix-len 7000] [--input-len 512] [--output-len 64] [--num-prefix-groups 12] \
        [--num-prompts 600] [--request-rate 4] [--csv FILE] [--html FILE]
"""

from __future__ import annotations

import argparse
import csv
import time
from typing import Any

COLUMNS = ("kv_cache_memory_gib", "manager", "retention_interval", "num_pages",
           "prefix_cache_hit_rate_perc", "mean_ttft_ms", "p99_ttft_ms", "mean_kv_usage_perc",
           "sliding_peak_pages", "sliding_mean_pages", "full_peak_pages", "full_mean_pages",
           "num_preemptions")


FULL = "full"  # (the full-attention baseline, in the list of intervals)


def run_one(trace: Any, args: argparse.Namespace, memory_gib: float,
            interval: int | str | None) -> dict[str, Any]:
    """One simulation: `interval` FULL is full attention on every layer (vLLM's
    --disable-hybrid-kv-cache-manager), else the hybrid manager at that retention interval
    (None: every sliding-window page cached)."""
    from kvlab.metrics import summarize
    from kvlab.policies.serving import ServingConfig
    from kvlab.sim import SimConfig, simulate

    serving = ServingConfig.create(
        "paged", enable_prefix_caching=True, kv_cache_memory_bytes=int(memory_gib * 2**30),
        hybrid_kv_cache_manager=interval != FULL,
        prefix_cache_retention_interval=None if interval == FULL else interval)
    config = SimConfig(model=args.model, hardware=args.hardware, serving=serving)
    summary = summarize(simulate(trace, config))
    groups = summary.get("kv_cache_groups") or []
    row: dict[str, Any] = {
        "kv_cache_memory_gib": memory_gib,
        "manager": "full attention" if interval == FULL else "hybrid",
        "retention_interval": "" if interval == FULL else str(interval),
        "num_pages": config.capacity.num_pages,
    }
    for key in ("prefix_cache_hit_rate_perc", "mean_ttft_ms", "p99_ttft_ms",
                "mean_kv_usage_perc", "num_preemptions"):
        row[key] = summary[key]
    for kind, name in (("sliding_window", "sliding"), ("full", "full")):
        index = next((i for i, label in enumerate(groups) if label.startswith(kind)), None)
        for stat in ("peak", "mean"):
            row[f"{name}_{stat}_pages"] = ("" if index is None
                                           else summary[f"kv_group_{index}_{stat}_pages"])
    return row


def main() -> None:
    """Simulate the sweep, print the table, write the CSV and the figure."""
    from kvlab.traces import load_trace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-oss-20b")
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--memories", default="2,3,4,6,8",
                        help="KV cache sizes in GiB, comma-separated")
    parser.add_argument("--intervals", default="none,0,512,2048,8192",
                        help="retention intervals in tokens, comma-separated (none: every "
                        "sliding-window page cached; 0: vLLM 0.32's default)")
    parser.add_argument("--prefix-len", type=int, default=7000)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-prefix-groups", type=int, default=12)
    parser.add_argument("--num-prompts", type=int, default=600)
    parser.add_argument("--request-rate", type=float, default=4.0)
    parser.add_argument("--csv", default=None, help="write every run's row to this CSV")
    parser.add_argument("--html", default=None, help="write the figure to this HTML file")
    args = parser.parse_args()

    trace = load_trace("random", num_prompts=args.num_prompts, request_rate=args.request_rate,
                       random_prefix_len=args.prefix_len, random_input_len=args.input_len,
                       random_output_len=args.output_len,
                       num_prefix_groups=args.num_prefix_groups)
    memories = [float(m) for m in args.memories.split(",")]
    intervals: list[int | str | None] = [
        FULL, *(None if r == "none" else int(r) for r in args.intervals.split(","))]
    started = time.process_time()
    rows = [run_one(trace, args, memory, interval)
            for memory in memories for interval in intervals]
    cpu_s = time.process_time() - started

    print("| KV memory (GiB) | manager | retention interval | pages | prefix hit rate (%) "
          "| mean TTFT (ms) | P99 TTFT (ms) | sliding pages peak / mean "
          "| full pages peak / mean | preemptions |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        sliding = (f"{row['sliding_peak_pages']} / {row['sliding_mean_pages']:.0f}"
                   if row["sliding_peak_pages"] != "" else "-")
        full = (f"{row['full_peak_pages']} / {row['full_mean_pages']:.0f}"
                if row["full_peak_pages"] != "" else "-")
        print(f"| {row['kv_cache_memory_gib']:g} | {row['manager']} | "
              f"{row['retention_interval'] if row['retention_interval'] != '' else '-'} | "
              f"{row['num_pages']} | {row['prefix_cache_hit_rate_perc']:.2f} | "
              f"{row['mean_ttft_ms']:.1f} | {row['p99_ttft_ms']:.1f} | {sliding} | {full} | "
              f"{row['num_preemptions']} |")
    print(f"\n{len(rows)} runs simulated in {cpu_s:.1f} CPU s")
    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    if args.html:
        write_figure(rows, args, args.html)


def write_figure(rows: list[dict[str, Any]], args: argparse.Namespace, path: str) -> None:
    """Prefix hit rate and mean TTFT against KV memory, one line per manager and interval."""
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=("Prefix cache hit rate (%)",
                                                           "Mean TTFT (ms)"))
    labels: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        label = ("full attention" if row["manager"] == "full attention"
                 else f"hybrid, retention {row['retention_interval']}")
        labels.setdefault(label, []).append(row)
    for label, runs in labels.items():
        memory = [r["kv_cache_memory_gib"] for r in runs]
        for col, key in ((1, "prefix_cache_hit_rate_perc"), (2, "mean_ttft_ms")):
            figure.add_scatter(x=memory, y=[r[key] for r in runs], name=label, legendgroup=label,
                               showlegend=col == 1, mode="lines+markers", row=1, col=col)
    figure.update_xaxes(title_text="KV cache memory (GiB)")
    figure.update_layout(title=f"{args.model} on {args.hardware}: {args.num_prefix_groups} "
                         f"prefixes of {args.prefix_len} tokens, visited in turn",
                         width=1000, height=420)
    figure.write_html(path, include_plotlyjs="cdn")


if __name__ == "__main__":
    main()
