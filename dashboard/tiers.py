"""Tiers page: how much memory below the device is worth it for this workload. A list of tier
configurations (host sizes, or host plus SSD) is simulated on the sidebar's setup, each with
prefix caching, and charted as the prompt tokens each memory level served and the goodput."""

from __future__ import annotations

import streamlit as st

from kvlab.dashboard import figures
from kvlab.dashboard.runs import parse_values, sweep
from kvlab.dashboard.widgets import chart, current_setup, table, user_errors
from kvlab.errors import KvlabError
from kvlab.policies import parse_policy

RESULT = "tiers_result"
DEFAULT_TIERS = "none,host:64GiB,host:256GiB,host:1TiB,host:256GiB+ssd:2TiB"
MAX_CONFIGS = 12
SHOWN = ("kv_tiers", "prefix_cache_hit_rate_perc", "device_prefix_hit_rate_perc",
         "host_tier_hit_rate_perc", "ssd_tier_hit_rate_perc", "request_goodput",
         "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "error")


def main() -> None:
    """Render the Tiers page."""
    st.title("kvlab · Memory tiers")
    setup = current_setup()
    text = st.text_input(
        "Tier configurations", DEFAULT_TIERS, key="tiers_values",
        help="comma-separated; each is none or KIND:SIZE[:eviction=...] tiers joined by `+` "
        "(kinds host, ssd, remote), as `kvlab sim --kv-tiers`")
    cols = st.columns(4)
    policy_text = cols[0].text_input("Policy", "paged:eviction=lru", key="tiers_policy",
                                     help="prefix caching is on for every configuration")
    ttft = cols[1].number_input("TTFT SLO (ms)", 0.0, value=2000.0, step=500.0, key="tiers_ttft")
    tpot = cols[2].number_input("TPOT SLO (ms)", 0.0, value=100.0, step=10.0, key="tiers_tpot")
    run = cols[3].button("Run", key="tiers_run", type="primary")
    st.caption("Goodput counts the requests meeting both SLOs per second (vLLM's definition). "
               "Write policy, reuse threshold, tier page size and layerwise loads: `kvlab "
               "sweep --grid kv_tier_write=...` (`kv_tier_block_size`, ...), then read the "
               "folder on the Sweep page.")
    if run:
        with user_errors():
            values = parse_values("kv_tiers", text)
            if len(values) > MAX_CONFIGS:
                raise KvlabError(f"{len(values)} configurations; the page runs at most "
                                 f"{MAX_CONFIGS} (use kvlab sweep for more)")
            policy = parse_policy(policy_text)
            if not policy.prefix_caching:  # "none" is compared with the cache on too
                policy = policy.with_options(eviction="lru")
            bar = st.progress(0.0, text=f"0 of {len(values)} configurations")
            grid = sweep(setup, policy, "kv_tiers", values, None, [],
                         goodput_slos={"ttft": ttft, "tpot": tpot},
                         on_point=lambda done, total: bar.progress(
                             done / total, text=f"{done} of {total} configurations"))
            bar.empty()
        st.session_state[RESULT] = grid
    if RESULT not in st.session_state:
        st.info("Press **Run** to simulate each tier configuration on the sidebar's workload.")
        return
    grid = st.session_state[RESULT]
    errors = grid["error"].dropna()
    if len(errors):
        st.warning(f"{len(errors)} configurations failed; the first: {errors.iloc[0]}")
    chart(figures.tier_figure(grid[grid["error"].isna()]), "tiers_chart")
    table(grid[[c for c in SHOWN if c in grid]], "tiers_table")


if __name__ == "__main__":
    main()
