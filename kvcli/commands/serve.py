"""`kvlab serve MODEL`: the real engine behind an OpenAI-compatible HTTP server (vLLM's
endpoints and `/metrics` names, plus kvlab's memory series), until SIGTERM or SIGINT.

MODEL is a preset (`tiny-llama`) or a local Hugging Face folder; the policy, scheduler and
memory flags are `kvlab run`'s. It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse

from kvlab.cli.commands.common import (
    DEFAULT_CPU_KV_CACHE_MEMORY,
    add_device_arguments,
    add_serving_arguments,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab serve` (no heavy imports here)."""
    parser.add_argument("model", metavar="MODEL", nargs="?", default=None,
                        help="tiny-llama, tiny-qwen2 (random weights), stdlib-llama (trained on "
                        "Python's standard library: text and chat work), or a local Hugging Face "
                        "folder (or as vLLM's --model)")
    parser.add_argument("--model", dest="model_flag", default=None, metavar="MODEL",
                        help=argparse.SUPPRESS)
    http = parser.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    http.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    http.add_argument("--api-key", default=None,
                      help="require `Authorization: Bearer KEY` on every /v1 route")
    http.add_argument("--served-model-name", default=None,
                      help="the model name clients send and /v1/models lists (default: MODEL)")
    http.add_argument("--max-queue", type=int, default=1024,
                      help="requests waiting to run before new ones get 503 (default 1024)")
    http.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="SECONDS",
                      help="on SIGTERM/SIGINT, how long running requests may finish before "
                      "they are aborted (default 10)")
    http.add_argument("--profile-path", default=None, metavar="FILE",
                      help="write every step's profile row here at exit (CSV, or .parquet): "
                      "what `kvlab calibrate` fits")
    http.add_argument("--kv-events-config", default=None, metavar="JSON",
                      help="publish the prefix cache's changes as vLLM's KV events, with "
                      "vLLM's JSON: '{\"enable_kv_cache_events\": true, \"publisher\": "
                      "\"zmq\", \"endpoint\": \"tcp://*:5557\", \"topic\": \"\"}' (needs "
                      "prefix caching on)")
    machine = parser.add_argument_group("device and memory")
    add_device_arguments(machine)
    machine.add_argument("--seed", type=int, default=0, help="seed of requests that give none")
    machine.add_argument("--num-threads", type=int, default=None, metavar="N",
                         help="torch CPU threads of the engine (default: torch's, one per "
                         "core; vLLM's CPU backend leaves a core to its front end)")
    add_serving_arguments(parser.add_argument_group("policy and scheduler"), machine, engine=True)


def run(args: argparse.Namespace) -> int:
    """Build the engine and serve until a signal."""
    import logging

    from kvlab.cli.commands.common import policy_warnings, print_warnings, serving_config
    from kvlab.engine.config import EngineConfig
    from kvlab.errors import KvlabError
    from kvlab.server import ServeConfig, serve

    if not 0 < args.port < 65536:
        raise KvlabError(f"--port {args.port}: expected 1 to 65535")
    if args.max_queue < 1:
        raise KvlabError(f"--max-queue {args.max_queue}: expected 1 or more")
    if (args.model is None) == (args.model_flag is None):
        raise KvlabError("give the model once: kvlab serve MODEL (or --model MODEL, as vLLM)")
    args.model = args.model or args.model_flag
    if not args.shutdown_timeout >= 0:
        raise KvlabError(f"--shutdown-timeout {args.shutdown_timeout}: expected seconds >= 0")
    if args.num_threads is not None and args.num_threads < 1:
        raise KvlabError(f"--num-threads {args.num_threads}: expected 1 or more")
    if args.kv_cache_memory_bytes is None and args.device == "cpu" and (
        args.num_gpu_blocks_override is None
    ):
        args.kv_cache_memory_bytes = DEFAULT_CPU_KV_CACHE_MEMORY
    kv_events = None
    if args.kv_events_config is not None:
        from kvlab.server.kv_event_publisher import parse_kv_events_config

        kv_events = parse_kv_events_config(args.kv_events_config)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    engine = EngineConfig(model=args.model, device=args.device, serving=serving_config(args),
                          attention_backend=args.attention_backend, dtype=args.dtype,
                          cpu_gemm=args.cpu_gemm)
    print_warnings(policy_warnings(engine.serving.policy))
    return serve(ServeConfig(
        engine=engine, host=args.host, port=args.port, api_key=args.api_key,
        served_model_name=args.served_model_name, max_queue=args.max_queue,
        shutdown_timeout_s=args.shutdown_timeout, profile_path=args.profile_path,
        kv_events=kv_events,
    ))
