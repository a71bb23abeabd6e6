"""kvlab.server: `kvlab serve`, an OpenAI-compatible HTTP server over the real engine, with
vLLM's Prometheus metrics and kvlab's memory series (layer 4: above the engine)."""

from kvlab.server.api import build_app
from kvlab.server.launch import ServeConfig, serve, start_service
from kvlab.server.service import EngineService, Overloaded

__all__ = ["EngineService", "Overloaded", "ServeConfig", "build_app", "serve", "start_service"]
