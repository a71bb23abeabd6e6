"""Live page: a running server's /metrics (kvlab serve's, or vLLM's: the names are the same),
scraped every few seconds and charted over time."""

from __future__ import annotations

import streamlit as st

from kvlab.bench import scrape_metrics
from kvlab.dashboard.live_figures import live_figures
from kvlab.dashboard.widgets import chart, user_errors

SAMPLES = "live_samples"
MAX_SAMPLES = 900  # 30 minutes at one scrape every 2 s


def main() -> None:
    """Render the Live page."""
    st.title("kvlab · Live server")
    st.caption("Point it at the `/metrics` of `kvlab serve` or of a vLLM server: KV-cache usage, "
               "queues, preemptions, swaps and prefix hits as they happen.")
    url = st.text_input("Metrics URL", "http://127.0.0.1:8000/metrics", key="live_url").strip()
    left, middle, right = st.columns(3)
    every = left.number_input("Scrape every (s)", 0.5, 60.0, 2.0, key="live_every")
    follow = middle.toggle("Follow", key="live_follow",
                           help="scrape again every few seconds (else once per click)")
    if right.button("Clear", key="live_clear"):
        st.session_state[SAMPLES] = []
    st.fragment(run_every=every if follow else None)(_scrape_and_draw)(url)


def _scrape_and_draw(url: str) -> None:
    samples = st.session_state.setdefault(SAMPLES, [])
    with user_errors():
        sample = scrape_metrics(url)
    samples.append(sample)
    del samples[:-MAX_SAMPLES]
    st.caption(f"{len(samples)} scrape(s) of {url}; latest: "
               f"{sample.get('vllm:num_requests_running'):.0f} running, "
               f"{sample.get('vllm:num_requests_waiting'):.0f} waiting, KV cache "
               f"{100 * sample.get('vllm:kv_cache_usage_perc'):.1f}% used")
    charts = live_figures(samples)
    for first in range(0, len(charts), 2):  # rows of two charts
        for column, index in zip(st.columns(2), range(first, min(first + 2, len(charts))),
                                 strict=False):
            with column:
                chart(charts[index], f"live_chart_{index}")


if __name__ == "__main__":
    main()
