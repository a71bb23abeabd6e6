"""`kvlab dashboard`: flags, the streamlit command line it runs, and its user errors."""

import argparse
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.cli.commands import dashboard


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    dashboard.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_it_runs_the_app_with_streamlit_on_localhost():
    argv = dashboard.streamlit_argv(parse("--port", "9000", "--headless"))
    assert argv[1:4] == ["-m", "streamlit", "run"]
    app = Path(argv[4])
    assert app.name == "app.py" and app.parent.name == "dashboard" and app.is_file()
    flags = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert flags["--server.address"] == "localhost"
    assert flags["--server.port"] == "9000"
    assert flags["--server.headless"] == "true"


def test_a_bad_port_is_a_one_line_user_error(capsys):
    assert main(["dashboard", "--port", "70000"]) == 2
    assert "--port 70000: expected 1 to 65535" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["kvlab.cli", "kvlab.cli.commands.dashboard"])
def test_the_command_does_not_import_the_dashboard(module):
    import subprocess
    import sys

    code = (f"import sys, {module}; assert 'kvlab.dashboard' not in sys.modules; "
            "assert 'streamlit' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_streamlit_always_runs_headless_and_kvlab_opens_the_browser():
    flags = dashboard.streamlit_argv(parse("--port", "9000"))
    assert flags[flags.index("--server.headless") + 1] == "true"  # no first-run e-mail prompt
    assert flags[flags.index("--browser.gatherUsageStats") + 1] == "false"


def test_without_a_terminal_it_serves_writes_no_credentials_and_sigterm_stops_streamlit(
        tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HOME": str(tmp_path)}
    kvlab = subprocess.Popen([sys.executable, "-m", "kvlab.cli", "dashboard", "--headless",
                              "--port", str(port)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                             cwd=tmp_path)
    try:
        for _ in range(120):  # polling start-up, not timing it
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health",
                                            timeout=2):
                    break
            except OSError:
                assert kvlab.poll() is None, "kvlab dashboard exited without a terminal"
                time.sleep(0.5)
        else:
            pytest.fail("kvlab dashboard did not answer its health check")
        children = Path(f"/proc/{kvlab.pid}/task/{kvlab.pid}/children").read_text().split()
        assert children, "streamlit runs as kvlab's child"
        kvlab.send_signal(signal.SIGTERM)
        assert kvlab.wait(timeout=30) is not None
        for pid in map(int, children):
            for _ in range(60):
                if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
                    break
                time.sleep(0.5)
            else:
                pytest.fail(f"streamlit (pid {pid}) outlived kvlab's SIGTERM")
    finally:
        if kvlab.poll() is None:
            kvlab.kill()
    assert not (tmp_path / ".streamlit" / "credentials.toml").exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except (OSError, IndexError):
        return "Z"
