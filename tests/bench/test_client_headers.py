"""What the client sends besides the body: X-Request-Id in vLLM's bench convention."""

from __future__ import annotations

from kvlab.bench.client import ClientConfig, PlannedRequest, run_client
from tests.bench.metrics_server import serve_http

REFUSED = b'{"error": {"message": "no model here"}}'


def _send(prefix):
    seen: list[dict[str, str]] = []
    url, stop = serve_http(lambda method, path: (400, "application/json", REFUSED), seen)
    try:
        config = ClientConfig(base_url=url, model="m", metrics_path=None,
                              request_id_prefix=prefix)
        planned = [PlannedRequest(request_id, [1, 2, 3], 3, 4, 0.001 * request_id)
                   for request_id in (7, 3, 12)]
        run = run_client(config, planned)
    finally:
        stop()
    assert all(r.error == "HTTP 400: no model here" for r in run.requests)
    return sorted(headers.get("X-Request-Id", "") for headers in seen)


def test_each_request_carries_its_trace_id_after_the_prefix():
    assert _send("bench-ab12cd34-") == ["bench-ab12cd34-12", "bench-ab12cd34-3",
                                        "bench-ab12cd34-7"]


def test_no_prefix_sends_no_request_id_header():
    assert _send(None) == ["", "", ""]
