"""The benchmark client: sends a workload's requests to an OpenAI-compatible `/v1/completions`
at their arrival times (or as fast as `max_concurrency` allows), streams every response and
timestamps each chunk, while another task reads the server's `/metrics` every
`scrape_interval_s`. One asyncio loop and one aiohttp session, as vLLM's `bench serve`.

The pages scraped during the run are kept as text and parsed afterwards, so that parsing never
competes with the streams for the client's CPU.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvlab.bench.host_cpu import host_cpu_times
from kvlab.bench.records import FINISH_STATUSES, BenchRequest
from kvlab.errors import KvlabError
from kvlab.heap import frozen_heap
from kvlab.policies import RequestStatus


@dataclass(slots=True, frozen=True)
class ClientConfig:
    """Where and how to send: the server, the model name, the sampling of every request.

    `max_concurrency` caps requests in flight (None: no cap); `ignore_eos` asks for exactly
    `max_tokens` tokens (a vLLM extension); `return_token_ids` asks the server to stream the
    token ids (vLLM and kvlab serve do), which counts the tokens of every chunk exactly;
    `request_timeout_s` bounds each request, so that a run always ends;
    `request_id_prefix` (vLLM's `--request-id-prefix`) sends each request with the header
    `X-Request-Id: <prefix><trace request id>`, which vLLM (and most OpenAI-compatible servers)
    takes as the request's id, so that the server's own records name the trace's requests
    (None: no header).
    """

    base_url: str
    model: str
    endpoint: str = "/v1/completions"
    api_key: str | None = None
    max_concurrency: int | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    return_token_ids: bool = True
    request_timeout_s: float = 600.0
    scrape_interval_s: float = 0.25
    metrics_path: str | None = "/metrics"
    request_id_prefix: str | None = None


@dataclass(slots=True)
class PlannedRequest:
    """One request to send: its id, prompt token ids, output budget and send time (s); its
    priority (sent as vLLM's `priority` field when not 0: a server that does not schedule by
    priority refuses it, as vLLM does)."""

    request_id: int
    prompt: list[int] | str
    prompt_len: int
    max_tokens: int
    arrival_s: float
    priority: int = 0


@dataclass(slots=True)
class ClientRun:
    """A finished client run: every request's record, the run's duration (first send to last
    finish, vLLM's benchmark duration), when it began (epoch seconds) and the /metrics pages
    read (epoch seconds, text), the first before any request and the last after all; with
    each scrape, the client host's CPU times (epoch seconds, steal and total ticks:
    `host_cpu.host_cpu_times`), where the host tells them."""

    requests: list[BenchRequest]
    duration_s: float
    started_at: float
    metrics_pages: list[tuple[float, str]] = field(default_factory=list)
    metrics_errors: list[str] = field(default_factory=list)
    host_cpu: list[tuple[float, float, float]] = field(default_factory=list)


def run_client(
    config: ClientConfig,
    planned: Sequence[PlannedRequest],
    *,
    on_finish: Callable[[BenchRequest], object] | None = None,
) -> ClientRun:
    """Send every planned request and wait for all of them (asyncio.run of `run_async`), the
    heap frozen meanwhile (`frozen_heap`): a full collection over a big process's start-up
    objects stalls the event loop for up to 0.35 s (measured in a pytest process that had
    collected the whole suite), and every token that arrives meanwhile is timestamped late,
    which moves the step boundaries the client reconstructs."""
    with frozen_heap():
        return asyncio.run(run_async(config, planned, on_finish=on_finish))


async def run_async(
    config: ClientConfig,
    planned: Sequence[PlannedRequest],
    *,
    on_finish: Callable[[BenchRequest], object] | None = None,
) -> ClientRun:
    """The whole run on the current loop: /metrics before, the requests with the scraper
    alongside, /metrics after."""
    import aiohttp

    limit = config.max_concurrency or 0
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=config.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     trust_env=False) as session:
        run = ClientRun([], 0.0, time.time())
        await _scrape_once(session, config, run)
        start = time.perf_counter()
        run.started_at = time.time()
        stop = asyncio.Event()
        scraper = asyncio.create_task(_scrape_loop(session, config, run, stop))
        records = await _send_all(session, config, planned, start, on_finish)
        run.duration_s = max((r.finish_s or 0.0 for r in records), default=0.0)
        stop.set()
        await scraper
        await _scrape_once(session, config, run)
        run.requests = records
        return run


async def _send_all(
    session: Any,
    config: ClientConfig,
    planned: Sequence[PlannedRequest],
    start: float,
    on_finish: Callable[[BenchRequest], object] | None,
) -> list[BenchRequest]:
    """Start each request at its arrival time (under the concurrency cap) and gather them."""
    semaphore = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    url = config.base_url.rstrip("/") + config.endpoint
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    records = [BenchRequest(p.request_id, p.prompt_len, p.max_tokens, p.arrival_s)
               for p in planned]
    tasks = []
    for item, record in sorted(zip(planned, records, strict=True),
                               key=lambda pair: pair[0].arrival_s):
        delay = start + item.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = _payload(config, item)
        request_headers = headers if config.request_id_prefix is None else {
            **headers, "X-Request-Id": f"{config.request_id_prefix}{item.request_id}"}
        tasks.append(asyncio.create_task(
            _limited(session, url, request_headers, body, record, start, semaphore, on_finish)))
    await asyncio.gather(*tasks)
    return records


async def _limited(session: Any, url: str, headers: dict, body: dict, record: BenchRequest,
                   start: float, semaphore: asyncio.Semaphore | None,
                   on_finish: Callable[[BenchRequest], object] | None) -> None:
    if semaphore is None:
        await _stream(session, url, headers, body, record, start)
    else:
        async with semaphore:
            await _stream(session, url, headers, body, record, start)
    if on_finish is not None:
        on_finish(record)


def is_chat_endpoint(endpoint: str) -> bool:
    """Whether a route takes chat bodies (`messages`), as vLLM's openai-chat backend sends."""
    return endpoint.rstrip("/").endswith("chat/completions")


def _payload(config: ClientConfig, item: PlannedRequest) -> dict[str, Any]:
    """The /v1/completions body, or on a chat route the /v1/chat/completions one (the prompt
    text as one user message, `max_completion_tokens`), as vLLM's client sends them (plus the
    vLLM extensions asked)."""
    body: dict[str, Any] = {"model": config.model}
    if is_chat_endpoint(config.endpoint):
        body["messages"] = [{"role": "user", "content": item.prompt}]
        body["max_completion_tokens"] = item.max_tokens
    else:
        body["prompt"] = item.prompt
        body["max_tokens"] = item.max_tokens
    body.update(temperature=config.temperature, stream=True,
                stream_options={"include_usage": True})
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.return_token_ids:
        body["return_token_ids"] = True
    if item.priority:
        body["priority"] = item.priority
    return body


async def _stream(session: Any, url: str, headers: dict, body: dict, record: BenchRequest,
                  start: float) -> None:
    """Send one request and read its event stream into `record` (never raises)."""
    import aiohttp

    record.arrival_s = time.perf_counter() - start
    finish_reason = None
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                # the message of the whole body, then cut: a cut JSON body would not parse
                text = (await response.text())[:65536]
                record.error = f"HTTP {response.status}: {_error_message(text)[:300]}"
            else:
                finish_reason = await _read_events(response, record, start,
                                                   isinstance(body.get("prompt", ""), str))
    except asyncio.TimeoutError:
        record.error = "timed out"
        record.status = RequestStatus.FINISHED_ABORTED
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.finish_s = time.perf_counter() - start
    if record.status is RequestStatus.FINISHED_ABORTED:
        return
    if record.error is None and finish_reason in FINISH_STATUSES and record.chunk_times_s:
        record.status = FINISH_STATUSES[finish_reason]
    else:
        record.error = record.error or f"stream ended without output (finish {finish_reason})"
        record.status = RequestStatus.FINISHED_ERROR


async def _read_events(response: Any, record: BenchRequest, start: float,
                       text_prompt: bool) -> str | None:
    """Parse `data: {...}` events as chunks arrive; each chunk with tokens is timestamped on
    arrival. A `text_prompt`'s ids and length are the server's, where it tells them. Returns
    the finish reason."""
    buffer = b""
    finish_reason = None
    text_parts: list[str] = []
    token_ids: list[int] = []
    usage_tokens = None
    async for chunk in response.content.iter_any():
        now = time.perf_counter() - start
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            data = event.strip()
            if not data.startswith(b"data:"):
                continue
            data = data[5:].strip()
            if data == b"[DONE]":
                continue
            message = json.loads(data)
            if "error" in message:
                record.error = _error_message(json.dumps(message))
                continue
            for choice in message.get("choices") or ():
                if text_prompt and choice.get("prompt_token_ids"):
                    record.prompt_token_ids = list(choice["prompt_token_ids"])
                count = _chunk_tokens(choice, text_parts, token_ids)
                if count:
                    record.chunk_times_s.append(now)
                    record.chunk_tokens.append(count)
                finish_reason = choice.get("finish_reason") or finish_reason
            usage = message.get("usage")
            if usage:
                usage_tokens = usage.get("completion_tokens")
                if text_prompt and usage.get("prompt_tokens"):
                    record.prompt_len = int(usage["prompt_tokens"])
                details = usage.get("prompt_tokens_details") or {}
                record.num_cached_tokens = int(details.get("cached_tokens") or 0)
    record.generated_text = "".join(text_parts)
    record.output_token_ids = token_ids or None
    record.num_output_tokens = int(usage_tokens or sum(record.chunk_tokens))
    return finish_reason


def _chunk_tokens(choice: dict, text_parts: list[str], token_ids: list[int]) -> int:
    """Tokens in one streamed choice: its token ids when the server streams them, else 1 for
    a chunk with text (a completion's `text`, a chat chunk's `delta.content`; vLLM's client
    counts chunks the same way)."""
    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    text_parts.append(text)
    ids = choice.get("token_ids")
    if ids:
        token_ids.extend(ids)
        return len(ids)
    return 1 if text else 0


def _error_message(text: str) -> str:
    """The `message` of an OpenAI error body, or the text itself."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return text.strip()


async def _scrape_loop(session: Any, config: ClientConfig, run: ClientRun,
                       stop: asyncio.Event) -> None:
    """Read /metrics (and the host's CPU times) every scrape_interval_s until `stop`."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=config.scrape_interval_s)
        except asyncio.TimeoutError:
            await _scrape_once(session, config, run)


async def _scrape_once(session: Any, config: ClientConfig, run: ClientRun) -> None:
    """One /metrics page into run.metrics_pages, and the host's CPU times into run.host_cpu;
    a failure is noted, never raised."""
    import aiohttp

    times = host_cpu_times()
    if times is not None:
        run.host_cpu.append((time.time(), *times))
    if config.metrics_path is None:
        return
    url = config.base_url.rstrip("/") + config.metrics_path
    try:
        async with session.get(url) as response:
            if response.status != 200:
                run.metrics_errors.append(f"{url}: HTTP {response.status}")
                return
            run.metrics_pages.append((time.time(), await response.text()))
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        run.metrics_errors.append(f"{url}: {type(exc).__name__}: {exc}")


def get_json(base_url: str, path: str, *, api_key: str | None = None,
             timeout_s: float = 10.0, post: bool = False) -> Any:
    """GET (or with `post`, POST) base_url + path as JSON (the model list, a health check);
    a KvlabError naming the URL when the server cannot be read."""
    import urllib.error
    import urllib.request

    url = base_url.rstrip("/") + path
    request = urllib.request.Request(url, data=b"" if post else None,
                                     method="POST" if post else "GET")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        detail = _error_message(exc.read().decode("utf-8", errors="replace"))
        raise KvlabError(f"{url}: HTTP {exc.code}: {detail}", parameters=("base_url",)) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KvlabError(f"cannot reach {url}: {reason}", parameters=("base_url",)) from None


def reset_prefix_cache(base_url: str, *, api_key: str | None = None) -> None:
    """Empty the server's prefix cache (POST /reset_prefix_cache: vLLM's dev route, kvlab
    serve's); a KvlabError naming the flag when the server has no such route or refuses."""
    try:
        get_json(base_url, "/reset_prefix_cache", api_key=api_key, post=True)
    except KvlabError as exc:
        hint = (" (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)" if "HTTP 404" in str(exc)
                else " (it refuses while requests run)" if "HTTP 409" in str(exc) else "")
        raise KvlabError(f"--reset-prefix-cache: {exc}{hint}",
                         parameters=("reset_prefix_cache",)) from None


def wait_ready(base_url: str, timeout_s: float, *, api_key: str | None = None,
               say: Callable[[str], None] | None = None) -> None:
    """Poll /v1/models until the server answers or `timeout_s` passes (0: ask once); the
    last error, naming the URL, when it never does. `say` is told once, at the first failed
    poll, what is awaited (a user must not wait in silence)."""
    deadline = time.monotonic() + timeout_s
    told = False
    while True:
        try:
            get_json(base_url, "/v1/models", api_key=api_key, timeout_s=5.0)
            return
        except KvlabError as exc:
            if "HTTP 401" in str(exc) or time.monotonic() >= deadline:
                waited = f" (waited {timeout_s:g} s)" if timeout_s > 0 else ""
                raise KvlabError(f"{exc}{waited}", parameters=("base_url",)) from None
            if say is not None and not told:
                say(f"waiting up to {timeout_s:g} s for a server at {base_url}/v1/models "
                    f"({exc})")
                told = True
        time.sleep(0.5)
