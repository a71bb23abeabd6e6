"""`kvlab serve` as a user runs it: a subprocess that starts, serves, and on SIGTERM lets the
running request finish or aborts it, writes its step profile (which calibrates like an offline
run's) and exits 0 with no page held."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pandas as pd

from kvlab.fidelity import fit_cost_model, load_profiles
from kvlab.metrics import STEP_COLUMNS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_drains_writes_the_profile_and_exits_0(tmp_path):
    port, profile = _free_port(), tmp_path / "live.steps.csv"
    command = [sys.executable, "-c", "from kvlab.cli import main; raise SystemExit(main())",
               "serve", "tiny-llama", "--port", str(port), "--num-gpu-blocks-override", "600",
               "--block-size", "4", "--shutdown-timeout", "1", "--profile-path", str(profile),
               "--num-threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "did not start"
            time.sleep(0.2)
        done = httpx.post(url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4})
        assert done.status_code == 200
        # a long request still running when the signal comes: aborted after the timeout
        with httpx.stream("POST", url + "/v1/completions", timeout=30, json={
                "prompt": [5, 6, 7], "max_tokens": 2000, "ignore_eos": True,
                "stream": True}) as response:
            lines = response.iter_lines()
            next(lines)
            process.send_signal(signal.SIGTERM)
            rest = list(lines)
        assert "data: [DONE]" in rest
        assert '"finish_reason": "abort"' in "".join(rest)  # cut at the shutdown timeout
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert "every page and host page came back" in output
    assert "torch CPU threads: 1" in output  # --num-threads
    steps = pd.read_csv(profile)
    assert list(steps.columns) == list(STEP_COLUMNS) and len(steps) > 4
    model = fit_cost_model(load_profiles([profile]))  # what `kvlab calibrate` does with it
    assert model.decode_token_s + model.step_overhead_s > 0


def test_a_bad_thread_count_is_one_line(capsys):
    from kvlab.cli import main

    assert main(["serve", "tiny-llama", "--num-threads", "0"]) != 0
    err = capsys.readouterr().err
    assert "--num-threads 0: expected 1 or more" in err and "Traceback" not in err
