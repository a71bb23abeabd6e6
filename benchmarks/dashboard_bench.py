"""Dashboard speed: the default Explore run (the bundled Azure conversation excerpt, first 1000
requests, Llama-2-7B on an A100-80GB, paged blocks of 16), as the page computes it.

Prints the seconds of each part: loading the trace, simulating, summarising into tables, building
the Explore figures, the page map at the busiest step, and a whole AppTest run of the app with a
cold cache (script, simulation and figures; no browser). Target: the default run renders within
5 s.

    .venv/bin/python benchmarks/dashboard_bench.py [--num-prompts 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"


def measure_parts(num_prompts: int) -> dict[str, float]:
    """Seconds of each step of the default Explore run, outside Streamlit."""
    from kvlab.dashboard import figures
    from kvlab.dashboard.pagemap import page_map_at
    from kvlab.dashboard.runs import run_view
    from kvlab.dashboard.workload import Setup, load_setup_trace

    setup = Setup(num_prompts=num_prompts)
    times: dict[str, float] = {}
    start = time.perf_counter()
    trace = load_setup_trace(setup)
    times["load trace"] = time.perf_counter() - start
    start = time.perf_counter()
    view = run_view(trace, setup, "paged")
    times["simulate + tables"] = time.perf_counter() - start
    start = time.perf_counter()
    page_size = int(view.summary["page_size"])
    built = [figures.kv_memory_figure(view.steps, page_size), figures.queue_figure(view.steps),
             figures.events_figure(view.steps), *figures.latency_cdfs({"paged": view.requests})]
    for fig in built:
        fig.to_json()  # what Streamlit sends to the browser
    times["figures (5, to JSON)"] = time.perf_counter() - start
    start = time.perf_counter()
    row = view.steps.iloc[int(view.steps["num_used_pages"].to_numpy().argmax())]
    pages = page_map_at(trace, setup.config("paged"), int(row["step_id"]), float(row["start_s"]),
                        float(row["duration_s"]))
    figures.page_map_figure(pages).to_json()
    times["page map at the busiest step"] = time.perf_counter() - start
    return times


def measure_apptest(num_prompts: int) -> float:
    """Seconds of one AppTest run of the whole app (cold cache), Explore page."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["num_prompts"] = num_prompts
    start = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - start
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 5
    return elapsed


def main() -> None:
    """Run each measurement `--repeat` times and print the best and the mean."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = [measure_parts(args.num_prompts) for _ in range(args.repeat)]
    apptest = [measure_apptest(args.num_prompts) for _ in range(args.repeat)]
    print(f"default Explore run: {args.num_prompts} requests of the azure-conv excerpt, "
          f"llama-2-7b on a100-80g, paged; best / mean of {args.repeat}")
    for name in runs[0]:
        values = [run[name] for run in runs]
        print(f"  {name:32s} {min(values):6.2f} s  {sum(values) / len(values):6.2f} s")
    parts = [sum(run[n] for n in run if not n.startswith("page map")) for run in runs]
    print(f"  {'total (no page map)':32s} {min(parts):6.2f} s  {sum(parts) / len(parts):6.2f} s")
    print(f"  {'AppTest run of the app (cold)':32s} {min(apptest):6.2f} s  "
          f"{sum(apptest) / len(apptest):6.2f} s")


if __name__ == "__main__":
    main()
