"""Router comparison on a simulated cluster (docs/experiments/router_comparison.md): one trace
on N instances under every router, as the dashboard's Routers page runs it, printed as a
Markdown table (and, with --html, the page's figures in one HTML file).

    .venv/bin/python benchmarks/router_comparison.py [--trace mooncake] [--num-instances 4] \
        [--model llama-3.1-8b] [--hardware h200-141g] [--gpu-memory-utilization 0.9] \
        [--time-scale 1] [--policy paged:eviction=lru] [--html FILE]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    """Simulate each router, print the table, write the figures."""
    from kvlab.dashboard import figures
    from kvlab.dashboard.cluster_runs import cluster_view, instance_table, router_table
    from kvlab.dashboard.workload import Setup, load_setup_trace
    from kvlab.policies.serving import ServingConfig
    from kvlab.sim import router_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="mooncake", help="bundled excerpt name")
    parser.add_argument("--num-instances", type=int, default=4)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h200-141g")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--policy", default="paged:eviction=lru")
    parser.add_argument("--html", default=None, help="write the figures to this HTML file")
    args = parser.parse_args()

    setup = Setup(trace=args.trace, model=args.model, hardware=args.hardware,
                  time_scale=args.time_scale,
                  serving=ServingConfig(gpu_memory_utilization=args.gpu_memory_utilization))
    trace = load_setup_trace(setup)
    capacity = setup.config(args.policy).capacity
    print(f"{trace.name}: {len(trace)} requests, time scale {args.time_scale:g}; "
          f"{args.num_instances} x {args.model} on {args.hardware}, "
          f"{capacity.num_tokens:,} KV tokens each, {args.policy}")
    started = time.process_time()
    views = [cluster_view(trace, setup, args.policy, args.num_instances, router)
             for router in router_names()]
    cpu_s = time.process_time() - started
    frame = router_table(views)
    instances = instance_table(views)
    routed = instances.groupby("router", sort=False)["num_prompts"].apply(
        lambda counts: "/".join(str(n) for n in counts))
    print()
    print("| router | prefix hit rate (%) | output tok/s | mean TTFT (ms) | p99 TTFT (ms) "
          "| requests per instance |")
    print("|---|---:|---:|---:|---:|---|")
    for row in frame.itertuples():
        print(f"| {row.router} | {row.prefix_cache_hit_rate_perc:.2f} | "
              f"{row.output_throughput:.1f} | {row.mean_ttft_ms:.1f} | {row.p99_ttft_ms:.1f} | "
              f"{routed[row.router]} |")
    print(f"\n{len(views)} cluster runs simulated in {cpu_s:.1f} CPU s")
    if args.html:
        parts = [figures.metric_bar_figure(frame, "prefix_cache_hit_rate_perc", "router"),
                 figures.metric_bar_figure(frame, "mean_ttft_ms", "router"),
                 figures.instance_bar_figure(instances, "num_prompts"),
                 figures.instance_bar_figure(instances, "prefix_cache_hit_rate_perc")]
        # plotly.js from its CDN: the file stays small enough to keep in the repository
        body = "\n".join(fig.to_html(full_html=False, include_plotlyjs="cdn" if i == 0 else
                                     False) for i, fig in enumerate(parts))
        with open(args.html, "w", encoding="utf-8") as out:
            out.write(f"<html><head><meta charset='utf-8'></head><body>\n{body}\n</body></html>\n")
        print(f"figures: {args.html}")


if __name__ == "__main__":
    main()
