"""`kvlab dashboard`: start the Streamlit policy explorer (dashboard/app.py) on localhost.

Streamlit always runs headless: its first-run "Welcome! Email:" prompt never appears (it
would block a run without a terminal and write ~/.streamlit/credentials.toml), usage
statistics stay off, and kvlab opens the browser itself unless `--headless`. SIGTERM, SIGHUP
or Ctrl-C stop the Streamlit child too."""

from __future__ import annotations

import argparse
import subprocess


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
        "true",  # always: no e-mail prompt, no credentials file; kvlab opens the browser
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
    return _run_child(streamlit_argv(args), None if args.headless else _url(args))


def _url(args: argparse.Namespace) -> str:
    host = "localhost" if args.host in ("0.0.0.0", "::") else args.host
    return f"http://{host}:{args.port}/"


def _run_child(argv: list[str], open_url: str | None) -> int:
    """Run Streamlit until it exits; our SIGTERM/SIGHUP end it too (terminate, then kill after
    10 s), and `open_url` opens in a browser once the server answers its health check."""
    import signal
    import threading

    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def stop(_signum: int, _frame: object) -> None:
        child.terminate()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    if open_url is not None:
        threading.Thread(target=_open_when_ready, args=(open_url, child), daemon=True).start()
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.terminate()
        raise
    finally:
        if child.poll() is None:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _open_when_ready(url: str, child: subprocess.Popen[bytes]) -> None:
    """Open `url` in the default browser once Streamlit's health check answers (60 s at most)."""
    import time
    import urllib.request
    import webbrowser

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        try:
            with urllib.request.urlopen(url + "_stcore/health", timeout=2):
                webbrowser.open(url)
                return
        except OSError:
            time.sleep(0.5)
