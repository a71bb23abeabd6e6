"""Validate page: a `kvlab validate` result, simulator and engine overlaid metric by metric."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from kvlab.dashboard import figures
from kvlab.dashboard.runs import load_validate_result, summaries_side_by_side
from kvlab.dashboard.widgets import chart, table, user_errors
from kvlab.errors import KvlabError

# How to make the JSON this page reads (see docs/validation.md).
MAKE_RESULT = """\
# against kvlab's own engine, on this machine's CPU (about 20 s)
kvlab validate --save-result --result-filename validate.json
# against a server (vLLM, vLLM-Ascend, kvlab serve): benchmark, fit, compare
kvlab validate --base-url http://127.0.0.1:8000 --num-prompts 48 --num-calibration-prompts 48 \\
    --num-windows 4 --time-scale 2 --save-result --result-filename validate.json"""


def main() -> None:
    """Render the Validate page."""
    st.title("kvlab · Validate the simulator")
    st.caption("Load the JSON that `kvlab validate` writes: per metric, the simulator's value, "
               "the engine's or the server's, and the relative error.")
    upload = st.file_uploader("Validate result (.json)", key="validate_upload")
    path_text = st.text_input("…or its path on this machine", key="validate_path").strip()
    if upload is not None:
        name, data = upload.name, upload.getvalue()
    elif path_text:
        path = Path(path_text).expanduser()
        with user_errors():
            if not path.is_file():
                raise KvlabError(f"{path}: no such file; expected a kvlab validate result JSON")
            name, data = path.name, path.read_bytes()
    else:
        st.info("Upload a result or type its path. To make one (a validation runs the real "
                "engine or benchmarks a server, minutes of work, so it runs from a terminal):")
        st.code(MAKE_RESULT, language="bash")
        return
    with user_errors():
        metrics, info = load_validate_result(name, data)
    lockstep = info.get("lockstep_identical")
    if lockstep is True:
        st.success("Lockstep replay: every scheduling decision of the simulator matched the "
                   "engine's.")
    elif lockstep is False:
        st.error("Lockstep replay: the simulator's decisions differed from the engine's (a bug "
                 "in one of them).")
    errors = metrics["rel_error"].abs()
    if errors.notna().any():
        worst = metrics.loc[errors.idxmax()]
        st.metric("Largest relative error", f"{100 * worst['rel_error']:+.1f}%",
                  help=f"{worst['metric']}; an empty error is undefined (the engine's value is 0)")
    scatter, errors = figures.validate_figures(metrics)
    left, right = st.columns(2)
    with left:
        chart(scatter, "validate_scatter")
    with right:
        chart(errors, "validate_errors")
    table(metrics, "validate_metrics")
    both = summaries_side_by_side(info)
    if both is not None:
        with st.expander("Both summaries, key by key"):
            table(both, "validate_summaries")
    details = {k: v for k, v in info.items() if k not in ("engine", "sim")}
    if details:
        with st.expander("Lockstep report, cost model and calibration"):
            st.json(details, expanded=False)


if __name__ == "__main__":
    main()
