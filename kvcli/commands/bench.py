"""`kvlab bench serve`: replay a trace against any OpenAI-compatible server (vLLM, vLLM-Ascend,
`kvlab serve`) in `vllm bench serve`'s conventions: its flags, its printed report, its result
JSON (`--save-detailed` keeps the per-request arrays), plus the KV-cache section that the
server's `/metrics` gives (usage, preemptions, prefix hits, read every 0.25 s) and kvlab's
tables (per request, and the metrics' time series).

Prompts are token ids of the trace's lengths; Mooncake hash ids map to the same token blocks
for the same id, so the server's prefix cache sees the trace's sharing. Arrivals are those of
`kvlab sim`: the trace's timestamps (over --time-scale), or resampled at --request-rate.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from typing import Any

from kvlab.cli.commands.common import add_report_arguments, add_workload_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kvlab bench` has one subcommand, `serve`."""
    sub = parser.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)
    serve = sub.add_parser(
        "serve", help="benchmark an OpenAI-compatible server on a trace",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_arguments(serve)


BACKENDS = ("openai", "vllm", "openai-chat")


def endpoint_of(args: argparse.Namespace) -> str:
    """The route to send to: --endpoint, else the --backend's (a KvlabError where the two
    disagree, as vLLM's client refuses a chat backend on another route)."""
    from kvlab.bench.client import is_chat_endpoint
    from kvlab.errors import KvlabError

    chat = args.backend == "openai-chat"
    if args.endpoint is None:
        return "/v1/chat/completions" if chat else "/v1/completions"
    if chat and not is_chat_endpoint(args.endpoint):
        raise KvlabError(f"--backend openai-chat sends chat completions; --endpoint "
                         f"{args.endpoint} does not end in chat/completions",
                         parameters=("endpoint",))
    return str(args.endpoint)


def _text_of(tokenizer: str | None, endpoint: str) -> Any:
    """A chat route's decoder of prompt ids into text (--tokenizer's), else None."""
    from kvlab.bench.client import is_chat_endpoint

    if tokenizer is None or not is_chat_endpoint(endpoint):
        return None
    from transformers import AutoTokenizer

    decode = AutoTokenizer.from_pretrained(tokenizer).decode
    return lambda ids: decode(ids, skip_special_tokens=True)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab bench serve`."""
    server = parser.add_argument_group("server")
    server.add_argument("--base-url", default=None,
                        help="server root, e.g. http://127.0.0.1:8000 (default: from --host "
                        "and --port)")
    server.add_argument("--host", default="127.0.0.1",
                        help="server address without --base-url (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=8000,
                        help="server port without --base-url (default 8000)")
    server.add_argument("--backend", choices=BACKENDS, default="openai",
                        help="the API to speak, as vllm bench serve's: openai and vllm send "
                        "completions, openai-chat chat completions (each prompt one user "
                        "message: text, so token-id prompts need --tokenizer; default openai)")
    server.add_argument("--endpoint", default=None,
                        help="the route (default /v1/completions; with --backend openai-chat "
                        "/v1/chat/completions; a route ending in chat/completions sends chat "
                        "bodies)")
    server.add_argument("--model", default=None,
                        help="model name to send (default: the server's first model)")
    add_client_arguments(server)
    server.add_argument("--ready-check-timeout-sec", type=float, default=30.0,
                        help="wait this long for the server to answer /v1/models (default 30)")
    add_workload_arguments(
        parser.add_argument_group("workload"),
        num_prompts=None,
        num_prompts_help="send the first N requests (random: generate N, default 1000)",
        seed_help="seed of prompt ids, resampled arrivals and synthetic lengths",
    )
    sending = parser.add_argument_group("sending")
    sending.add_argument("--ignore-eos", action="store_true",
                         help="ask for exactly each request's output length (vLLM extension)")
    sending.add_argument("--temperature", type=float, default=0.0,
                         help="sampling temperature (default 0: greedy)")
    sending.add_argument("--num-warmups", type=int, default=0,
                         help="requests sent before the run and left out of it (default 0)")
    sending.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                         help="give up on a request after this long (default 600)")
    sending.add_argument("--request-id-prefix", default=None, metavar="PREFIX",
                         help="send each request with the header X-Request-Id: PREFIX<request "
                         "id>, the id a vLLM server gives it (default: bench-<8 random hex "
                         "digits>-, as vllm bench serve)")
    sending.add_argument("--no-metrics", action="store_true",
                         help="do not read /metrics (a server without one)")
    sending.add_argument("--kv-events", default=None, metavar="ENDPOINT",
                         help="subscribe to the server's KV events (ZMQ, vLLM's "
                         "--kv-events-config publisher) at tcp://HOST:PORT during the run and "
                         "save them beside the result as <stem>.kv_events.jsonl, with the "
                         "prompts' token ids (what `kvlab validate --lockstep` replays)")
    sending.add_argument("--reset-prefix-cache", action="store_true",
                         help="empty the server's prefix cache before the run (POST "
                         "/reset_prefix_cache: kvlab serve; vLLM with VLLM_SERVER_DEV_MODE=1)")
    out = parser.add_argument_group("report and results")
    add_report_arguments(out, save_help="write the result JSON (vLLM's keys) and the "
                         "per-request and metrics tables")
    out.add_argument("--save-detailed", action="store_true",
                     help="keep the per-request arrays in the JSON (ttfts, itls, ...): what "
                     "`kvlab calibrate --from-bench` and vLLM's analysis scripts read")
    out.add_argument("--append-result", action="store_true",
                     help="append the result JSON as one line to an existing file")
    out.add_argument("--label", default=None,
                     help="prefix of the result file name and its `label` (default: openai)")
    out.add_argument("--metadata", nargs="+", default=None, metavar="KEY=VALUE",
                     help="extra key-value pairs saved with the result")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the report, save what was asked."""
    from kvlab.bench import ClientConfig, bench_serve, resolve_model, vocab_size_of, wait_ready
    from kvlab.cli.commands.common import load_trace_from_args, show_progress, summary_options
    from kvlab.cli.report import format_report

    _check_flags(args)
    options = summary_options(args)
    metadata = _metadata_pairs(args.metadata)
    base_url = base_url_of(args)
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    trace = load_trace_from_args(args)  # a bad workload fails before the server is asked
    wait_ready(base_url, args.ready_check_timeout_sec, api_key=api_key,
               say=lambda line: print(line, file=sys.stderr, flush=True))
    card = resolve_model(base_url, args.model, api_key)
    vocab = vocab_size_of(card, args.tokenizer, args.vocab_size)
    client = ClientConfig(
        base_url=base_url, model=str(card["id"]), endpoint=endpoint_of(args), api_key=api_key,
        max_concurrency=args.max_concurrency, ignore_eos=args.ignore_eos,
        temperature=args.temperature, request_timeout_s=args.request_timeout,
        scrape_interval_s=args.metrics_interval,
        metrics_path=None if args.no_metrics else "/metrics",
        request_id_prefix=(f"bench-{uuid.uuid4().hex[:8]}-" if args.request_id_prefix is None
                           else args.request_id_prefix),
    )
    print(f"Benchmarking {base_url} ({card['id']}): {len(trace)} requests of {trace.name}")
    extra = {"label": args.label or "openai", "max_concurrency": args.max_concurrency,
             "base_url": base_url, "model_id": card["id"],
             "tokenizer_id": args.tokenizer or card["id"], "num_warmups": args.num_warmups,
             "ignore_eos": args.ignore_eos, **metadata}
    with _progress(len(trace), show_progress(args)) as bar:
        result = bench_serve(trace, client, card=card, vocab_size=vocab, seed=args.seed,
                             num_warmups=args.num_warmups, metadata=extra,
                             on_finish=lambda _: bar.update(1), kv_events=args.kv_events,
                             reset_cache=args.reset_prefix_cache,
                             text_of=_text_of(args.tokenizer, client.endpoint))
    summary = result.summary(**options)
    _print_failures(result)
    for error in result.metrics_errors[:3]:
        print(f"warning: could not read the server's metrics: {error}")
    print(format_report(summary))
    if result.kv_events is not None:
        print(describe_stream(result.kv_events))
    if args.save_result or args.append_result:
        _save(args, result, summary)
    if result.kv_events is not None:
        check_stream(result.kv_events)
    if result.requests and not any(r.completed for r in result.requests):
        print(f"kvlab bench: error: every one of the {len(result.requests)} requests failed "
              "(the first errors are above)", file=sys.stderr)
        return 1
    return 0


def add_client_arguments(group: argparse._ArgumentGroup) -> None:
    """The client flags of every command that benchmarks a server (bench serve, validate
    --base-url): prompt vocabulary, key, concurrency cap, /metrics interval."""
    group.add_argument("--vocab-size", type=int, default=None,
                       help="draw prompt ids below this (default: from --tokenizer's or the "
                       "model folder's config.json, or the server's model card)")
    group.add_argument("--api-key", default=None,
                       help="bearer token (default: $OPENAI_API_KEY when set)")
    group.add_argument("--max-concurrency", type=int, default=None,
                       help="at most this many requests in flight (default: no cap)")
    group.add_argument("--metrics-interval", type=float, default=0.25, metavar="SECONDS",
                       help="read the server's /metrics this often during a run (default 0.25)")


def check_client_flags(args: argparse.Namespace) -> None:
    """A KvlabError for a bad `add_client_arguments` flag."""
    from kvlab.errors import KvlabError

    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise KvlabError(f"--max-concurrency {args.max_concurrency}: expected 1 or more")
    if not 0 < args.metrics_interval < float("inf"):
        raise KvlabError(f"--metrics-interval {args.metrics_interval:g}: expected a finite "
                         "number of seconds > 0")


def base_url_of(args: argparse.Namespace) -> str:
    """--base-url, else http://HOST:PORT."""
    return (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")


def _check_flags(args: argparse.Namespace) -> None:
    from kvlab.errors import KvlabError

    url = base_url_of(args)
    if not url.startswith(("http://", "https://")):
        raise KvlabError(f"--base-url {url!r}: expected an http:// or https:// URL")
    check_client_flags(args)
    if args.num_warmups < 0:
        raise KvlabError(f"--num-warmups {args.num_warmups}: expected 0 or more")
    for flag, value in (("--request-timeout", args.request_timeout),
                        ("--ready-check-timeout-sec", args.ready_check_timeout_sec + 1)):
        if not value > 0 or value == float("inf"):
            raise KvlabError(f"{flag} {value:g}: expected a finite number of seconds > 0")
    if not 0 <= args.temperature < float("inf"):
        raise KvlabError(f"--temperature {args.temperature:g}: expected a number >= 0")
    if args.kv_events is not None:
        from kvlab.bench.kv_event_stream import normalize_endpoint

        normalize_endpoint(args.kv_events)


def _metadata_pairs(items: list[str] | None) -> dict[str, str]:
    """--metadata KEY=VALUE ... as a dict (vLLM's format)."""
    from kvlab.errors import KvlabError

    pairs = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise KvlabError(f"--metadata {item!r}: expected KEY=VALUE")
        pairs[key.strip()] = value.strip()
    return pairs


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="requests", leave=False, disable=not enabled)


def _print_failures(result: Any) -> None:
    """vLLM prints the first errors of failed requests (at most 10)."""
    failed = [r for r in result.requests if not r.completed]
    if failed:
        print("Failed requests during benchmark run detected (capping to 10):")
        for index, record in enumerate(failed[:10]):
            print(f"Error {index}: {record.error}")


def describe_stream(stream: Any) -> str:
    """One line: what the KV event subscription received."""
    kinds: dict[str, int] = {}
    for batch in stream.batches:
        for event in batch.events:
            kinds[event["type"]] = kinds.get(event["type"], 0) + 1
    counted = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "no events"
    lost = f"; {len(stream.missing_seqs)} batches lost" if stream.missing_seqs else ""
    return f"KV events from {stream.endpoint}: {len(stream.batches)} batches ({counted}){lost}"


def check_stream(stream: Any) -> None:
    """A KvlabError when the subscription received nothing (after the result is saved)."""
    from kvlab.errors import KvlabError

    if not stream.num_events:
        raise KvlabError(f"--kv-events {stream.endpoint}: no KV events arrived during the run; "
                         "start the server with --kv-events-config '{\"enable_kv_cache_events"
                         "\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:PORT\"}' "
                         "and prefix caching on, and connect to its host and port")


def _save(args: argparse.Namespace, result: Any, summary: dict) -> None:
    from kvlab.bench.result_files import save_bench_result

    detailed = args.save_detailed or result.kv_events is not None  # lockstep reads the arrays
    paths = save_bench_result(result, summary, result_dir=args.result_dir,
                              result_filename=args.result_filename,
                              table_format=args.table_format, append=args.append_result,
                              detailed=detailed)
    print("Saved " + ", ".join(str(path) for path in paths))
