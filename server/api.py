"""The OpenAI-compatible HTTP API over an `EngineService` (FastAPI, as vLLM's server).

`/v1/completions`, `/v1/chat/completions` (when the tokenizer has a chat template),
`/v1/models`, `/health`, `/version`, `/metrics`. Request and response shapes follow vLLM's
`vllm/entrypoints/openai/`; every user mistake is an OpenAI error JSON with a 4xx status.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from kvlab import __version__
from kvlab.engine.sampler import SamplingParams
from kvlab.errors import KvlabError
from kvlab.policies.request import Request as EngineRequest
from kvlab.server.metrics import CONTENT_TYPE
from kvlab.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    describe_validation_error,
    error_body,
)
from kvlab.server.service import EngineService, Event, Overloaded, Stream

MAX_BODY_BYTES = 8 * 2**20  # a body larger than this is refused before it is parsed
DISCONNECT_POLL_S = 1.0  # how often a non-streaming request checks that its client is there


class APIError(Exception):
    """A request the server refuses: its HTTP status, OpenAI error type and the field."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    @property
    def error_type(self) -> str:
        """OpenAI's name for the status (as vLLM writes it)."""
        return {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                413: "RequestTooLargeError", 503: "ServiceUnavailableError"}.get(
                    self.status, "BadRequestError")


@dataclass(slots=True)
class Prepared:
    """One prompt ready to run: its text (when given as text), token ids and parameters."""

    text: str | None
    token_ids: list[int]
    params: SamplingParams


def build_app(service: EngineService, *, model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving `service` under the model name `model_name`; with `api_key`,
    every /v1 route wants `Authorization: Bearer <api_key>`."""
    app = FastAPI(title="kvlab serve", version=__version__)
    engine = service.engine
    tokenizer = engine.tokenizer
    max_model_len, vocab_size = engine.max_model_len, engine.model_config.vocab_size
    manager = engine.manager  # read-only here: its sizing rules
    has_chat_template = bool(getattr(tokenizer, "chat_template", None))
    scheduling_policy = engine.config.serving.scheduling_policy

    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(error_body(err.message, err.status, err.error_type, err.param),
                            status_code=err.status)

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable) -> Response:
        # /reset_prefix_cache changes state: it wants the key too (vLLM serves it only in
        # its dev mode)
        if api_key is not None and (request.url.path.startswith("/v1")
                                    or request.url.path == "/reset_prefix_cache"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return JSONResponse(
                    error_body("invalid or missing API key", 401, "AuthenticationError"),
                    status_code=401,
                )
        response: Response = await call_next(request)
        return response

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        # vLLM's dev-mode route: benchmarks and KV lockstep start from an empty cache.
        success = await asyncio.to_thread(service.reset_prefix_cache)
        return JSONResponse({"success": success}, status_code=200 if success else 409)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()),
            "owned_by": "kvlab", "root": model_name, "max_model_len": max_model_len,
            "vocab_size": vocab_size,  # kvlab's: benchmark clients draw prompt ids below it
        }]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        assert isinstance(body, CompletionRequest)
        prompts = _prompt_list(body.prompt)
        prepared = [_prepare(text, ids, body, body.max_tokens) for text, ids in
                    (_tokenize(prompt, index) for index, prompt in enumerate(prompts))]
        return await _respond(request, body, prepared, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        assert isinstance(body, ChatCompletionRequest)
        if not has_chat_template:
            raise APIError(400, f"model {model_name!r} has no chat template: use "
                           "/v1/completions", "messages")
        messages = [message.model_dump() for message in body.messages]
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))
        return await _respond(request, body, [_prepare(None, ids, body,
                                                       body.max_completion_tokens or
                                                       body.max_tokens)], chat=True)

    # ----------------------------------------------------------------------------- parsing

    async def _parse(request: Request, model: type[BaseModel]) -> BaseModel:
        size = 0
        chunks = []
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object")
        try:
            body = model.model_validate(data)
        except ValidationError as exc:
            message, param = describe_validation_error(exc)
            raise APIError(400, message, param) from None
        assert isinstance(body, SamplingFields)
        if body.model is not None and body.model != model_name:
            raise APIError(404, f"The model `{body.model}` does not exist.", "model")
        if body.n != 1:
            raise APIError(400, "n: only n=1 is supported", "n")
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options can only be given with stream=true",
                           "stream_options")
        return body

    def _tokenize(prompt: str | list[int], index: int) -> tuple[str | None, list[int]]:
        if isinstance(prompt, list):
            return None, prompt
        if tokenizer is None:
            raise APIError(400, f"prompt {index} is text, but model {model_name!r} has no "
                           "tokenizer: send token ids", "prompt")
        return prompt, list(tokenizer(prompt)["input_ids"])

    def _prepare(text: str | None, ids: list[int], body: SamplingFields,
                 max_tokens: int | None) -> Prepared:
        if not ids:
            raise APIError(400, "the prompt is empty", "prompt")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab_size})",
                           "prompt")
        if max_tokens is None:
            max_tokens = max(1, max_model_len - len(ids))
        if len(ids) + max_tokens > max_model_len:
            raise APIError(400, (
                f"This model's maximum context length is {max_model_len} tokens. However, you "
                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                f"{max_tokens} in the completion). Please reduce the length of the prompt or "
                "of the completion."), "max_tokens")
        sized = EngineRequest(0, len(ids), max_tokens)
        needed, num_pages = manager.pages_needed_alone(sized), manager.num_total_pages
        if needed > num_pages:
            raise APIError(400, f"the request needs {needed} KV pages but the cache has only "
                           f"{num_pages} ({manager.explain_pages_needed(sized)})", "max_tokens")
        try:
            params = SamplingParams(
                temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                max_tokens=max_tokens, seed=body.seed, ignore_eos=body.ignore_eos,
                stop_token_ids=tuple(body.stop_token_ids),
            )
        except KvlabError as exc:
            raise APIError(400, str(exc)) from None
        return Prepared(text, ids, params)

    # ----------------------------------------------------------------------------- responding

    async def _respond(request: Request, body: SamplingFields, prepared: list[Prepared], *,
                       chat: bool) -> Response:
        if body.priority and not scheduling_policy.startswith("priority"):
            # as vLLM: a priority other than 0 is an error unless the server orders by it
            raise APIError(400, f"priority {body.priority}: the server schedules by "
                           f"{scheduling_policy}; a priority other than 0 needs "
                           "--scheduling-policy priority", "priority")
        loop = asyncio.get_running_loop()
        streams: list[Stream] = []
        try:
            # a whole response reads its tokens once, unless a stop string must be watched for
            each_token = body.stream or bool(body.stop_strings())
            for item in prepared:
                streams.append(service.submit(item.token_ids, item.params, loop,
                                              each_token=each_token, priority=body.priority))
        except Overloaded as exc:
            _abort(streams)
            raise APIError(503, f"the server is busy: {exc}") from None
        except KvlabError as exc:  # a prompt the engine refuses (memory)
            _abort(streams)
            raise APIError(400, str(exc), "prompt") from None
        outputs = [_Output(item, body.stop_strings(), tokenizer) for item in prepared]
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            chunks = _stream_chunks(streams, outputs, body, request_id, created, chat)
            return StreamingResponse(chunks, media_type="text/event-stream")
        if not await _collect(request, streams, outputs):
            return Response(status_code=499)  # the client went away: nothing to send
        return JSONResponse(_full_response(outputs, body, request_id, created, chat))

    async def _collect(request: Request, streams: list[Stream], outputs: list[_Output]) -> bool:
        """Read every stream to its end; False (and everything aborted) if the client left."""
        pending = {asyncio.ensure_future(_drain(stream, output)): stream
                   for stream, output in zip(streams, outputs, strict=True)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S)
                for task in done:
                    pending.pop(task)
                if pending and await request.is_disconnected():
                    return False
            return True
        finally:
            for task in pending:
                task.cancel()
            _abort([stream for stream, output in zip(streams, outputs, strict=True)
                    if output.finish_reason is None])

    async def _drain(stream: Stream, output: _Output) -> None:
        while output.finish_reason is None:
            if output.add(await stream.get()):
                service.abort(stream.request.request_id)  # a stop string: stop generating

    async def _stream_chunks(streams: list[Stream], outputs: list[_Output],
                             body: SamplingFields, request_id: str, created: int,
                             chat: bool) -> AsyncIterator[str]:
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        async def forward(index: int, stream: Stream) -> None:
            while True:
                event = await stream.get()
                await events.put((index, event))
                if event.finish_reason is not None:
                    return

        tasks = [asyncio.ensure_future(forward(i, s)) for i, s in enumerate(streams)]
        head = {"id": request_id, "created": created, "model": model_name,
                "object": "chat.completion.chunk" if chat else "text_completion"}
        try:
            if chat:
                yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                            "content": ""}, "logprobs": None, "finish_reason": None}]})
            num_open, started = len(streams), set()
            while num_open:
                index, event = await events.get()
                output = outputs[index]
                if output.finish_reason is not None:
                    continue  # ended by a stop string; the engine's last events are stale
                start_ids = len(output.token_ids)
                if output.add(event):
                    service.abort(streams[index].request.request_id)
                text = output.text_to_send()
                choice = _stream_choice(output, index, text, start_ids, index not in started,
                                        body, chat)
                started.add(index)
                if output.finish_reason is not None:
                    num_open -= 1
                yield _sse({**head, "choices": [choice]})
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _sse({**head, "choices": [], "usage": _usage(outputs)})
            yield "data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()
            _abort([stream for stream, output in zip(streams, outputs, strict=True)
                    if output.finish_reason is None])

    def _abort(streams: list[Stream]) -> None:
        for stream in streams:
            service.abort(stream.request.request_id)

    def _full_response(outputs: list[_Output], body: SamplingFields, request_id: str,
                       created: int, chat: bool) -> dict:
        choices = []
        for index, output in enumerate(outputs):
            choice: dict[str, Any] = {"index": index, "logprobs": None,
                                      "finish_reason": output.finish_reason,
                                      "stop_reason": output.stop_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": output.text}
            else:
                choice["text"] = output.text
            if body.return_token_ids:
                choice["prompt_token_ids"] = output.prompt_token_ids
                choice["token_ids"] = output.token_ids
            choices.append(choice)
        return {"id": request_id, "object": "chat.completion" if chat else "text_completion",
                "created": created, "model": model_name, "choices": choices,
                "usage": _usage(outputs)}

    return app


class _Output:
    """One choice as it grows: tokens, text, and why it ended (stop strings applied here: the
    engine knows only stop token ids)."""

    def __init__(self, prepared: Prepared, stops: list[str], tokenizer: Any) -> None:
        self.prompt_token_ids = prepared.token_ids
        self.token_ids: list[int] = []
        self.text = ""
        self.num_text_sent = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._stops = stops
        self._tokenizer = tokenizer

    def add(self, event: Event) -> bool:
        """Take an event; True when a stop string just ended the choice."""
        self.token_ids += event.token_ids
        if self._tokenizer is not None and event.token_ids:
            self.text = self._tokenizer.decode(self.token_ids, skip_special_tokens=True)
        for stop in self._stops:
            at = self.text.find(stop)
            if at >= 0:
                self.text, self.finish_reason, self.stop_reason = self.text[:at], "stop", stop
                return True
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            if event.finish_reason == "stop" and self.token_ids:
                self.stop_reason = self.token_ids[-1]
        return False

    def text_to_send(self) -> str:
        """Text not streamed yet, holding back what could still become a stop string."""
        end = len(self.text)
        if self.finish_reason is None and self._stops:
            end = max(self.num_text_sent, end - max(len(stop) for stop in self._stops) + 1)
        text = self.text[self.num_text_sent:end]
        self.num_text_sent = end
        return text


def _stream_choice(output: _Output, index: int, text: str, start_ids: int, first: bool,
                   body: SamplingFields, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "logprobs": None,
                              "finish_reason": output.finish_reason,
                              "stop_reason": output.stop_reason}
    if chat:
        choice["delta"] = {"content": text} if text else {}
    else:
        choice["text"] = text
    if body.return_token_ids:
        choice["token_ids"] = output.token_ids[start_ids:]
        if first:
            choice["prompt_token_ids"] = output.prompt_token_ids
    return choice


def _usage(outputs: list[_Output]) -> dict[str, int]:
    prompt = sum(len(output.prompt_token_ids) for output in outputs)
    completion = sum(len(output.token_ids) for output in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _prompt_list(prompt: Any) -> list[str | list[int]]:
    """One prompt or a list of them (text, or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(item, int) for item in prompt):
        return [list(prompt)]
    if not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    return list(prompt)
