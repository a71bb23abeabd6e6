"""`kvlab dashboard`: flags, the streamlit command line it runs, and its user errors."""

import argparse
from pathlib import Path

import pytest

from kvlab.cli import main
from kvlab.commands import dashboard


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


@pytest.mark.parametrize("module", ["kvlab.cli", "kvlab.commands.dashboard"])
def test_the_command_does_not_import_the_dashboard(module):
    import subprocess
    import sys

    code = (f"import sys, {module}; assert 'kvlab.dashboard' not in sys.modules; "
            "assert 'streamlit' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
