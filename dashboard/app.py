"""Entry script of the kvlab policy explorer (`kvlab dashboard` runs it with Streamlit).

The sidebar (workload and machine) is drawn here, before the page, so every page simulates the
same setup and its widgets keep their values when the page changes.
"""

from pathlib import Path

import streamlit as st

from kvlab.dashboard.widgets import sidebar_setup

# A local icon: Streamlit fetches a material or emoji favicon from the internet.
st.set_page_config(page_title="kvlab policy explorer",
                   page_icon=str(Path(__file__).with_name("icon.png")), layout="wide")
PAGES = [
    st.Page("explore.py", title="Explore", icon=":material/insights:", default=True),
    st.Page("compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("sweep.py", title="Sweep", icon=":material/grid_on:"),
    st.Page("tiers.py", title="Tiers", icon=":material/layers:"),
    st.Page("routers.py", title="Routers", icon=":material/hub:"),
    st.Page("validate.py", title="Validate", icon=":material/fact_check:"),
    st.Page("live.py", title="Live", icon=":material/monitor_heart:"),
]
page = st.navigation(PAGES)
sidebar_setup()
page.run()
