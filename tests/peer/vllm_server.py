"""Start and stop the peer: a real vLLM (`make vllm-peer`) serving the exported tiny-llama on
loopback, with the start command of FACTS.md (run in a scratch folder that keeps its log)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER_PYTHON = Path(os.environ.get("KVLAB_VLLM_PYTHON", ROOT / ".peer/vllm/bin/python"))
PEER_MODEL = Path(os.environ.get("KVLAB_VLLM_MODEL", ROOT / ".peer/tiny-llama"))
START_TIMEOUT_S = 240.0
# KV bytes of one block of the exported tiny-llama at block 32: 2 layers x K,V x 2 heads x
# 32 dims x 4 bytes x 32 tokens
BLOCK_BYTES = 32 * 1024


def missing_reason() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    if not PEER_PYTHON.is_file():
        return f"no vLLM peer at {PEER_PYTHON}: run `make vllm-peer`"
    if not (PEER_MODEL / "config.json").is_file():
        return f"no peer model at {PEER_MODEL}: run `make vllm-peer`"
    return None


def plugin_missing_reason() -> str | None:
    """Why the peer cannot run kvlab's vLLM plugin here (the peer is missing, or kvlab is not
    installed in it), or None when it can."""
    reason = missing_reason()
    if reason is not None:
        return reason
    if not list(PEER_PYTHON.parent.parent.glob("lib/python*/site-packages/kvlab-*.dist-info")):
        return f"kvlab's vLLM plugin is not installed in {PEER_PYTHON}: run `make vllm-plugin`"
    return None


@dataclass
class PeerServer:
    """A running vLLM: its URL, model name (the folder path) and process."""

    base_url: str
    model: str
    process: subprocess.Popen
    log_path: Path
    # the scheduler's log files' stem (kvlab's plugin, KVLAB_VLLM_STEP_LOG)
    schedule_log: Path | None = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_vllm(*, block_size: int = 32, kv_cache_memory_bytes: int = 64 << 20,
               max_model_len: int = 2048, prefix_caching: bool = False,
               extra: tuple[str, ...] = (), env: dict[str, str] | None = None,
               log_schedule: bool = False, model: Path = PEER_MODEL) -> PeerServer:
    """Start vLLM on a free port and wait until /health answers (25-30 s on this machine).
    `model`: another model folder. `log_schedule`: its scheduler logs every step (kvlab's
    plugin with KVLAB_VLLM_STEP_LOG, as a user starts it for `kvlab validate --step-log`;
    read with `kvlab.fidelity.step_log.read_schedule_log(server.schedule_log, prefix)`):
    skips the test where the plugin is not installed in the peer."""
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="kvlab-peer-"))
    log_path = workdir / "vllm.log"
    schedule_log = workdir / "schedule.jsonl" if log_schedule else None
    if schedule_log is not None:
        reason = plugin_missing_reason()
        if reason is not None:
            pytest.skip(f"the scheduler's log is kvlab's plugin's: {reason}")
        env = {**(env or {}), "KVLAB_VLLM_STEP_LOG": str(schedule_log)}
    command = [
        str(PEER_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--block-size", str(block_size),
        "--max-model-len", str(max_model_len), "--enforce-eager",
        "--kv-cache-memory-bytes", str(kv_cache_memory_bytes),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        *extra,
    ]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_LOGGING_LEVEL": "WARNING",
           **(env or {})}
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                   env=env)
    server = PeerServer(f"http://127.0.0.1:{port}", str(model), process, log_path,
                        schedule_log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited at start; see {log_path}:\n"
                               + log_path.read_text()[-3000:])
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=2):
                return server
        except OSError:
            time.sleep(1.0)
    server.stop()
    raise RuntimeError(f"vLLM did not answer /health in {START_TIMEOUT_S:.0f} s; see {log_path}")


def start_vllm_with_kv_events(num_blocks: int, *, log_schedule: bool = False,
                              model: Path = PEER_MODEL, extra: tuple[str, ...] = (),
                              env: dict[str, str] | None = None
                              ) -> tuple[PeerServer, str]:
    """`start_vllm` with `num_blocks` blocks of KV and prefix caching, publishing its KV events
    on a free port, its prefix cache resettable (`VLLM_SERVER_DEV_MODE`, /reset_prefix_cache).
    `model`: another folder whose blocks are BLOCK_BYTES too (`save_sliding_window_model`);
    `extra`: more vLLM flags; `env`: more environment variables (`KVLAB_VLLM_EVICTION`).
    Returns the server and the endpoint to subscribe to."""
    port = _free_port()
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": f"tcp://*:{port}", "topic": ""})
    server = start_vllm(kv_cache_memory_bytes=num_blocks * BLOCK_BYTES, prefix_caching=True,
                        extra=("--kv-events-config", config, *extra),
                        env={"VLLM_SERVER_DEV_MODE": "1", **(env or {})},
                        log_schedule=log_schedule,
                        model=model)
    return server, f"tcp://127.0.0.1:{port}"


def save_sliding_window_model(folder: Path, window: int = 32) -> Path:
    """A tiny Mistral in `folder` (made once) with a sliding window of `window` tokens on every
    layer (vLLM refuses Qwen2 with windows on some layers only) and a tokenizer: 2 layers of
    2 KV heads of 32 dims (vLLM CPU's attention has no head size 16), so a block of 32 tokens
    is BLOCK_BYTES as the exported tiny-llama's. Needs torch and transformers (the main
    venv's)."""
    from tests.engine.engine_hf_models import save_hf_model, save_tokenizer, tiny_mistral_config

    if not (folder / "config.json").is_file():
        save_hf_model(folder, tiny_mistral_config(sliding_window=window, head_dim=32,
                                                  max_position_embeddings=2048), seed=3)
        save_tokenizer(folder, vocab_size=384)
    return folder


def validate_sliding_lockstep(base_url: str, endpoint: str, folder: Path,
                              result_dir: Path, step_log: Path | None = None
                              ) -> tuple[int, dict]:
    """`kvlab validate --lockstep --kv-events` against the server at `base_url` (KV events at
    `endpoint`) of a sliding-window model `folder`, on six shared 512-token prefixes with 192
    tokens after each and 48 out, 200 requests at 30/s: the exit code and the saved KV
    lockstep report. `step_log`: the server's scheduler log (`--step-log`), else the
    client's view of its steps."""
    from kvlab.cli import main

    logged = [] if step_log is None else ["--step-log", str(step_log)]
    code = main(["validate", "--base-url", base_url, "--kv-events", endpoint, *logged,
                 "--lockstep", "--reset-prefix-cache", "--dataset-name", "random",
                 "--num-prompts", "200", "--random-input-len", "192",
                 "--random-output-len", "48", "--random-prefix-len", "512",
                 "--num-prefix-groups", "6", "--request-rate", "30", "--vocab-size", "384",
                 "--model", str(folder), "--save-result", "--result-dir", str(result_dir),
                 "--result-filename", "kv.json"])
    return code, json.loads((result_dir / "kv.json").read_text())["kv_lockstep"]
