"""A static /metrics page on a loopback port, in a thread: what a vLLM server would expose."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable

# A few of the series vLLM 0.32's CPU server exposes (two engines for the label sums).
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5
"""


def serve_text(text: Callable[[], str]) -> tuple[str, Callable[[], None]]:
    """Serve `text()` at /metrics; returns the URL and a stop function."""

    def respond(method: str, path: str) -> tuple[int, str, bytes]:
        return (200 if path == "/metrics" else 404), "text/plain; version=0.0.4", text().encode()

    url, stop = serve_http(respond)
    return url + "/metrics", stop


def serve_http(respond: Callable[[str, str], tuple[int, str, bytes]],
               seen_headers: list[dict[str, str]] | None = None
               ) -> tuple[str, Callable[[], None]]:
    """A loopback HTTP server answering GET and POST with `respond(method, path)` -> (status,
    content type, body), noting each request's headers in `seen_headers` where given; returns
    its root URL and a stop function."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            if seen_headers is not None:
                seen_headers.append(dict(self.headers))
            if method == "POST":
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, content_type, body = respond(method, self.path)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_address[1]}", stop
