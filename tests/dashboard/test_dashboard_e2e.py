"""End to end: `kvlab dashboard` serves the app on localhost and headless Chromium renders it."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--window-size=1400,1800", "--virtual-time-budget=15000")
# Polling limits, not assertions on speed: the server starts, then simulates the default run.
START_TRIES, RENDER_TRIES = 120, 20

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} is absent (apt-get install -y chromium)"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _chromium(url: str, profile: Path, *args: str) -> str:
    done = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@pytest.fixture
def server(tmp_path):
    """`kvlab dashboard --headless` on a free localhost port; yields its URL."""
    port = _free_port()
    kvlab = [sys.executable, "-m", "kvlab.cli", "dashboard", "--headless", "--port", str(port)]
    process = subprocess.Popen(kvlab, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=tmp_path, start_new_session=True)
    url = f"http://localhost:{port}/"
    try:
        for _ in range(START_TRIES):
            try:
                with urllib.request.urlopen(url + "_stcore/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.5)  # polling the server's start-up, not timing anything
        else:
            pytest.fail("kvlab dashboard did not answer its health check")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def test_the_app_renders_its_title_and_charts_in_chromium(server, tmp_path):
    profile = tmp_path / "profile"
    dom = ""
    for _ in range(RENDER_TRIES):  # the first loads wait for the default simulation
        dom = _chromium(server, profile, "--dump-dom")
        if "stPlotlyChart" in dom and "main-svg" in dom:
            break
    assert "kvlab · Explore a policy" in dom
    assert "KV cache over time" in dom
    assert "Traceback" not in dom
    # the favicon is served by the app itself: nothing is fetched from the internet
    icons = re.findall(r'<link[^>]*rel="(?:shortcut )?icon"[^>]*>', dom)
    assert icons and not any("https://" in link for link in icons), icons
    shot = tmp_path / "explore.png"
    for _ in range(RENDER_TRIES):  # each load reruns the app: its chart may not be drawn yet
        _chromium(server, profile, f"--screenshot={shot}")
        pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
        # The stacked KV chart's green (real tokens) must cover a real area of the page.
        green = (pixels[..., 1] - pixels[..., 0] > 30) & (pixels[..., 1] - pixels[..., 2] > 20)
        if green.mean() > 0.01:
            break
    kept = os.environ.get("KVLAB_SCREENSHOT")
    if kept:
        shutil.copy(shot, kept)
    assert pixels.shape[:2] == (1800, 1400)
    assert green.mean() > 0.01
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 100
