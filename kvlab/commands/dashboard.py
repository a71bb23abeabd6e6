"""`kvlab dashboard`: start the Streamlit policy explorer (dashboard/app.py) on localhost."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab dashboard` (no heavy imports here)."""
    parser.add_argument(
        "--host", default="localhost", help="address to listen on (default: localhost only)"
    )
    parser.add_argument("--port", type=int, default=8501, help="port (default: 8501)")
    parser.add_argument(
        "--headless", action="store_true", help="do not open a browser; just print the URL"
    )
    parser.add_argument(
        "--max-upload-mb",
        type=int,
        default=50,
        help="largest trace file the upload widget accepts (default: 50)",
    )


def app_path() -> str:
    """The dashboard's entry script, found without importing kvlab.dashboard."""
    import importlib.util
    from pathlib import Path

    from kvlab.errors import KvlabError

    spec = importlib.util.find_spec("kvlab.dashboard")
    if spec is None or not spec.submodule_search_locations:
        raise KvlabError(
            "kvlab.dashboard is not installed; install kvlab with the "
            "dashboard extra: pip install -e '.[dashboard]'"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "app.py")


def streamlit_argv(args: argparse.Namespace) -> list[str]:
    """The `streamlit run` command line for these flags."""
    import sys

    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        app_path(),
        "--server.address",
        args.host,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true" if args.headless else "false",
        "--server.maxUploadSize",
        str(args.max_upload_mb),
        "--browser.gatherUsageStats",
        "false",
        "--theme.base",
        "light",
    ]


def run(args: argparse.Namespace) -> int:
    """Run Streamlit in the foreground until interrupted; return its exit code."""
    import importlib.util
    import subprocess

    from kvlab.errors import KvlabError

    if not 1 <= args.port <= 65535:
        raise KvlabError(f"--port {args.port}: expected 1 to 65535")
    if args.max_upload_mb < 1:
        raise KvlabError(f"--max-upload-mb {args.max_upload_mb}: expected a whole number >= 1")
    if importlib.util.find_spec("streamlit") is None:
        raise KvlabError(
            "streamlit is not installed; install kvlab with the dashboard extra: "
            "pip install -e '.[dashboard]'"
        )
    return subprocess.call(streamlit_argv(args))
