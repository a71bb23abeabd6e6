"""`serve`: an engine, its service thread and the HTTP API under uvicorn, until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.server.api import build_app
from kvlab.server.kv_event_publisher import KVEventPublisher, KVEventsConfig
from kvlab.server.metrics import ServerMetrics
from kvlab.server.service import EngineService

log = logging.getLogger("kvlab.server")
# uvicorn's grace period beyond the service's drain: streams cut at the drain's end still send
# their last chunk and close.
GRACE_S = 5


@dataclass(slots=True, frozen=True)
class ServeConfig:
    """Where and how to serve: the engine's config, the address, the key and the limits.

    `max_queue` bounds the requests waiting to run (past it: 503). On SIGTERM or SIGINT the
    server stops accepting, lets running requests finish for `shutdown_timeout_s`, aborts the
    rest and exits. `profile_path` receives every step's profile row at exit (the columns of
    `kvlab run --save-result`'s steps table, what `kvlab calibrate` fits). `kv_events`
    publishes the prefix cache's changes as vLLM's KV events.
    """

    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None
    max_queue: int = 1024
    shutdown_timeout_s: float = 10.0
    profile_path: str | None = None
    kv_events: KVEventsConfig | None = None


def start_service(config: ServeConfig) -> tuple[EngineService, str]:
    """Build the engine and start its service thread; returns it and the served model name."""
    engine = LLMEngine(config.engine)
    name = config.served_model_name or str(config.engine.model)
    manager = engine.manager
    labels = {
        "block_size": str(manager.page_size),
        "num_gpu_blocks": str(manager.num_total_pages),
        "num_cpu_blocks": str(manager.num_host_pages),
        "enable_prefix_caching": str(engine.policy.prefix_caching),
        "gpu_memory_utilization": str(config.engine.serving.gpu_memory_utilization),
        "cache_dtype": config.engine.serving.kv_cache_dtype,  # vLLM's label
        "prefix_cache_retention_interval": str(
            config.engine.serving.prefix_cache_retention_interval),  # (vLLM's too)
    }
    serving = config.engine.serving
    scheduler = {
        "max_num_seqs": str(serving.max_num_seqs),
        "max_num_batched_tokens": str(serving.max_num_batched_tokens),
        "enable_chunked_prefill": str(serving.enable_chunked_prefill),
        "scheduler_reserve_full_isl": str(serving.scheduler_reserve_full_isl),
        "scheduling_policy": serving.scheduling_policy,
        "max_model_len": str(engine.max_model_len),
        "policy": engine.policy.to_string(),
    }
    metrics = ServerMetrics(name, manager, labels, engine.policy.to_string(), scheduler)
    publisher = None
    if config.kv_events is not None:
        publisher = KVEventPublisher(config.kv_events, manager.page_size)
    service = EngineService(engine, metrics, max_queue=config.max_queue, publisher=publisher,
                            keep_steps=config.profile_path is not None)
    service.start()
    return service, name


def serve(config: ServeConfig) -> int:
    """Serve until a signal, then shut down gracefully; returns the exit code (0)."""
    import uvicorn

    service, name = start_service(config)
    for line in service.engine.startup_lines:
        log.info(line)
    if config.kv_events is not None and not service.engine.policy.prefix_caching:
        log.warning("--kv-events-config: prefix caching is off, so no block is ever stored and "
                    "no KV event published (add --enable-prefix-caching)")
    log.info("torch CPU threads: %d", torch.get_num_threads())  # (`--num-threads`)
    app = build_app(service, model_name=name, api_key=config.api_key)

    class Server(uvicorn.Server):
        """uvicorn, telling the service to drain when a signal stops it: running requests end
        (finished, or aborted at the timeout) before uvicorn's own grace period runs out."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            log.info("signal %d: draining for up to %g s", sig, config.shutdown_timeout_s)
            service.begin_stop(config.shutdown_timeout_s)
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level="info",
        timeout_graceful_shutdown=round(config.shutdown_timeout_s) + GRACE_S,
    ))
    # uvicorn re-raises the signal that stopped it once it has shut down, to the handler it
    # found: let that be one that returns, so that the service stops cleanly and we exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda number, frame: None)
    try:
        server.run()  # returns on SIGTERM/SIGINT, once open connections closed or timed out
    finally:
        service.stop(config.shutdown_timeout_s)
        if config.profile_path is not None:
            from kvlab.metrics import save_step_profile

            path = save_step_profile(service.steps, Path(config.profile_path))
            log.info("wrote the step profile to %s", path)
    return 0
