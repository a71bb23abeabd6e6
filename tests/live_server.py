"""A live `kvlab serve` in the test process: uvicorn on a free loopback port in a thread."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn

from kvlab.engine.config import EngineConfig
from kvlab.server import EngineService, ServeConfig, build_app, start_service
from kvlab.server.kv_event_publisher import KVEventsConfig


@dataclass
class LiveServer:
    """A running server: its URL, its service (engine thread) and uvicorn."""

    base_url: str
    service: EngineService
    server: uvicorn.Server
    thread: threading.Thread
    model_name: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.service.stop(5.0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_live_server(engine: EngineConfig, *, api_key: str | None = None,
                      max_queue: int = 1024, kv_events: KVEventsConfig | None = None
                      ) -> LiveServer:
    """Serve `engine` on a free port (publishing KV events with `kv_events`); returns once
    uvicorn accepts connections."""
    service, name = start_service(ServeConfig(engine=engine, max_queue=max_queue,
                                              kv_events=kv_events))
    app = build_app(service, model_name=name, api_key=api_key)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    return LiveServer(f"http://127.0.0.1:{port}", service, server, thread, name)


def record_priorities(server: LiveServer, monkeypatch: Any) -> list[int]:
    """The priorities of the requests the server's engine makes from now on, in order (the
    engine's `make_request` wrapped by `monkeypatch`)."""
    engine = server.service.engine
    seen: list[int] = []
    make_request = engine.make_request

    def recording(*args: Any, **kwargs: Any) -> Any:
        request = make_request(*args, **kwargs)
        seen.append(request.priority)
        return request

    monkeypatch.setattr(engine, "make_request", recording)
    return seen
